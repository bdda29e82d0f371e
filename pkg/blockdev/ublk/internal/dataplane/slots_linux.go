// A queue joining and leaving its thread: its fixed-file and buffer-table
// slots.

package dataplane

import (
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// attach sets up a queue on the thread: two fixed-file slots, a run of
// buffer slots (registered heads in copy mode), batch mode's fetch ring,
// and the FETCH of every tag, submitted before it returns so that
// START_DEV (or END_USER_RECOVERY) finds every tag fetched.
func (s *threadLoop) attach(l *queueState) error {
	if len(s.free) == 0 {
		return fmt.Errorf("server thread %d: no free queue slot: %w", s.t.id, ErrThreadFull)
	}
	base, ok := s.bufSlots.alloc(int(l.cfg.Depth))
	if !ok {
		return fmt.Errorf("server thread %d: no run of %d buffer slots: %w", s.t.id, l.cfg.Depth, ErrThreadFull)
	}
	slot := s.free[len(s.free)-1]
	l.s, l.ring, l.slot, l.bufBase = s, s.ring, slot, uint16(base)
	l.fileChar, l.fileBacking, l.fileFlag = int32(2*slot), int32(2*slot+1), uring.IOSQE_FIXED_FILE
	if s.ab.noFixedFiles() {
		l.fileChar, l.fileBacking, l.fileFlag = int32(l.cfg.CharFD), int32(l.cfg.Target.FD), 0
	}
	if err := l.setup(); err != nil {
		l.teardown()
		s.bufSlots.free(base, int(l.cfg.Depth))
		// Nothing of the thread's is left for the queue to clear: the
		// caller's own teardown (Queue.start) runs on another goroutine,
		// after the thread may have given the slots to the next queue.
		l.s, l.ring = nil, nil
		return err
	}
	s.free = s.free[:len(s.free)-1]
	s.slots[slot] = l
	l.attached = true
	s.setPollWindow()
	s.sizeIOWQ()
	s.setAdmitCap()
	if err := l.fetchAll(); err != nil {
		// The FETCHes that went in complete with the ring; the queue
		// cannot serve without the others.
		l.fail(err)
		return err
	}
	if _, err := s.ring.Submit(); err != nil {
		l.fail(err)
		return fmt.Errorf("submit fetches: %w", err)
	}
	return nil
}

// detach ends a queue that has nothing in flight: its slots are cleared,
// its memory unmapped, and Wait returns err.
func (s *threadLoop) detach(l *queueState, err error) {
	// Off every list of the thread first: a list that kept it would
	// touch its unmapped buffers (seen: the idle reclaim of a detached
	// copy-mode queue).
	for _, list := range []*[]*queueState{&s.held, &s.commits, &s.tails, &s.ending, &s.dirty, &s.admitting} {
		*list = slices.DeleteFunc(*list, func(q *queueState) bool { return q == l })
	}
	l.inHeld, l.inCommits, l.inTails, l.inEnding, l.dirty, l.inAdmitting = false, false, false, false, false, false
	l.teardown()
	s.bufSlots.free(int(l.bufBase), int(l.cfg.Depth))
	s.slots[l.slot] = nil
	s.free = append(s.free, l.slot)
	s.setPollWindow()
	s.sizeIOWQ()
	s.setAdmitCap()
	l.end(err)
}

// close ends the thread's ring and every queue it serves: closing the ring
// cancels their parked commands (devices with user recovery stay
// QUIESCED) and ends the kernel's use of their descriptors and buffers.
// It runs once the thread has exited (Thread.finish), or on the thread in
// tests; a second call does nothing.
//
// The kernel frees a ring only once every operation it had in flight has
// completed, and a queued read or write of a buffer that is not fixed
// resolves its address only when an io-wq worker runs it: the queues'
// buffers stay mapped until then (freeWhenRingFreed), so that no new
// mapping at their address (another volume's buffers) can take or give
// their data. Their descriptors are unmapped at once: the mapping holds
// /dev/ublkcN open, and user recovery waits for its release.
func (s *threadLoop) close(err error) {
	if s.ring == nil {
		return
	}
	runRingCloseHook(s)
	s.ring.Close()
	if err == nil {
		err = ErrQueueStopped
	}
	var held []*queueState
	for i, l := range s.slots {
		if l != nil {
			l.ring = nil // closed: nothing to clear on it
			l.descs.close()
			l.end(err)
			held = append(held, l)
			s.slots[i] = nil
		}
	}
	s.ring = nil
	go freeWhenRingFreed(s.ringFreed, held)
}

// freeWhenRingFreed unmaps the buffers of the queues once the kernel has
// freed their ring: the ring's fixed-file table then drops its end of the
// pipe (registerRingFreed), and freed reads end of file. A ring never
// freed (a kernel bug) keeps them mapped: a leak, not another volume's
// data.
func freeWhenRingFreed(freed *os.File, held []*queueState) {
	_, _ = io.Copy(io.Discard, freed)
	freed.Close()
	for _, l := range held {
		l.b.close()
		l.bufs.close()
		l.pool.close()
	}
}

// registerRingFreed puts the write end of a pipe in the last slot of the
// ring's fixed-file table and keeps only its read end (s.ringFreed): the
// kernel holds the write end until it frees the ring, after its last
// operation, and the read end then reads end of file.
func (s *threadLoop) registerRingFreed(slot uint32) error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return fmt.Errorf("ring-freed pipe: %w", err)
	}
	err := s.ring.UpdateFiles(slot, []int32{int32(p[1])})
	unix.Close(p[1])
	if err != nil {
		unix.Close(p[0])
		return fmt.Errorf("ring-freed pipe: %w", err)
	}
	s.ringFreed = os.NewFile(uintptr(p[0]), "ring-freed")
	return nil
}

// rangeAlloc hands out runs of consecutive slots of a table of n, first
// fit, and merges runs given back.
type rangeAlloc struct {
	runs [][2]int // free runs {start, length}, sorted by start
}

func newRangeAlloc(n int) rangeAlloc { return rangeAlloc{runs: [][2]int{{0, n}}} }

// alloc returns the start of a free run of n slots.
func (a *rangeAlloc) alloc(n int) (int, bool) {
	for i, r := range a.runs {
		if r[1] < n {
			continue
		}
		if r[1] == n {
			a.runs = append(a.runs[:i], a.runs[i+1:]...)
		} else {
			a.runs[i] = [2]int{r[0] + n, r[1] - n}
		}
		return r[0], true
	}
	return 0, false
}

// free gives back the run of n slots at start.
func (a *rangeAlloc) free(start, n int) {
	i := 0
	for i < len(a.runs) && a.runs[i][0] < start {
		i++
	}
	a.runs = append(a.runs, [2]int{})
	copy(a.runs[i+1:], a.runs[i:])
	a.runs[i] = [2]int{start, n}
	// Merge with the next run, then with the previous one.
	if i+1 < len(a.runs) && start+n == a.runs[i+1][0] {
		a.runs[i][1] += a.runs[i+1][1]
		a.runs = append(a.runs[:i+1], a.runs[i+2:]...)
	}
	if i > 0 && a.runs[i-1][0]+a.runs[i-1][1] == start {
		a.runs[i-1][1] += a.runs[i][1]
		a.runs = append(a.runs[:i], a.runs[i+1:]...)
	}
}
