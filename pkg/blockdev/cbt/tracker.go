package cbt

import (
	"fmt"
	"sync"
)

// Tracker is the change record of one device of a volume: a Bitmap per
// hardware queue, each marked by the thread serving that queue, and the
// extents carried over (recorded before the device started, or put back
// after a snapshot that failed).
//
// The record is trusted when it holds every range written since the
// volume's last snapshot: a tracker made with a trusted carry (the record a
// clean detach left) is; one made without (a device re-adopted after a
// restart, whose marks died with the old process) is not, until its first
// Cut, from which on its bitmaps have seen every write.
//
// Methods are safe for concurrent use.
type Tracker struct {
	queues []*Bitmap // fixed at New; their marks need no lock

	mu      sync.Mutex
	carry   []Extent
	trusted bool
}

// NewTracker returns the tracker of a device of size bytes with queues
// hardware queues, starting from carry (trusted says whether carry holds
// every change since the volume's last snapshot).
func NewTracker(size int64, queues int, carry []Extent, trusted bool) (*Tracker, error) {
	if queues <= 0 {
		return nil, fmt.Errorf("tracker of %d queues", queues)
	}
	t := &Tracker{queues: make([]*Bitmap, queues), carry: Union(carry), trusted: trusted}
	for i := range t.queues {
		b, err := NewBitmap(size)
		if err != nil {
			return nil, fmt.Errorf("tracker: %w", err)
		}
		t.queues[i] = b
	}
	return t, nil
}

// Queue returns the bitmap queue q marks, or nil for a queue it does not
// have.
func (t *Tracker) Queue(q int) *Bitmap {
	if q < 0 || q >= len(t.queues) {
		return nil
	}
	return t.queues[q]
}

// Cut returns the record (the carry and every queue's marks, normalized)
// and whether it is trusted, and starts a new, trusted one. The caller
// makes sure that no write reaches the backing file meanwhile (the
// device's I/O is held or its filesystem frozen), so that the cut falls
// exactly between the writes a snapshot holds and those it does not.
func (t *Tracker) Cut() (exts []Extent, trusted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	lists := [][]Extent{t.carry}
	for _, b := range t.queues {
		lists = append(lists, b.Cut())
	}
	exts, trusted = Union(lists...), t.trusted
	t.carry, t.trusted = nil, true
	return exts, trusted
}

// PutBack returns a cut (its extents and trust, as Cut gave them) to the
// record, when what the cut was for (a snapshot) failed: the next Cut then
// answers for the writes since the cut before it, and is untrusted if this
// one was.
func (t *Tracker) PutBack(exts []Extent, trusted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.carry = Union(t.carry, exts)
	t.trusted = t.trusted && trusted
}
