package dataplane

import (
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// TestAdmissionSharesTheDiskAndServesQuietFirst proves the thread's
// admission to the backing disk on the host's io_uring: with a share of 8
// slots, two busy queues of 32 reads each get 8 reads to the kernel and
// hold the other 56; a quiet queue's read that arrives then waits behind
// none of them: it takes the first slot that frees, and the busy queues
// take the rest in turn, so that neither gets ahead of the other by more
// than one.
func TestAdmissionSharesTheDiskAndServesQuietFirst(t *testing.T) {
	const depth, slots = 32, 8
	s := hostThread(t, QueueCost(4)+2*QueueCost(depth), 3)
	a, _ := hostQueue(t, s, depth, TargetFile)
	b, _ := hostQueue(t, s, depth, TargetFile)
	quiet, _ := hostQueue(t, s, 4, TargetFile)
	s.admitCap = slots
	for tag := range uint16(depth) {
		for _, l := range []*queueState{a, b} {
			setDesc(l, tag, uapi.IOOpRead, 8, uint64(tag)*8)
			if err := l.onCmd(tag, uapi.IOResOK); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.admitted != slots || s.ring.Unsubmitted() != slots || a.waitLen+b.waitLen != 2*depth-slots {
		t.Fatalf("%d admitted, %d SQEs, %d+%d held; want %d admitted and SQEs, %d held", s.admitted, s.ring.Unsubmitted(),
			a.waitLen, b.waitLen, slots, 2*depth-slots)
	}
	setDesc(quiet, 0, uapi.IOOpRead, 8, 0)
	if err := quiet.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	if quiet.backing != 0 || quiet.waitLen != 1 {
		t.Fatalf("the quiet read went past the full share (backing %d, held %d)", quiet.backing, quiet.waitLen)
	}
	if quiet.tally.backing != 1 {
		// Pause (Queue.Settled) must wait for it: it will reach the file.
		t.Fatalf("a read held for a disk slot counts %d backing operations for Pause, want 1", quiet.tally.backing)
	}
	waitReady(t, s, slots)
	n, err := s.reap()
	if err != nil || n != slots {
		t.Fatalf("reap = %d, %v; want %d", n, err, slots)
	}
	s.dispatch(n) // the 8 busy reads complete and are committed
	s.admit()     // as the round does after its completions
	if quiet.backing != 1 || quiet.tally.backing != 1 {
		t.Fatalf("the quiet read did not take the first free slot (backing %d, counted %d)", quiet.backing, quiet.tally.backing)
	}
	if s.admitted != slots {
		t.Fatalf("%d admitted after the round, want the full share %d", s.admitted, slots)
	}
	if d := a.backing - b.backing; d > 1 || d < -1 {
		t.Fatalf("busy queues admitted unevenly: %d and %d reads in flight", a.backing, b.backing)
	}
	if st := quiet.tally.diskWaits; st != 1 {
		t.Fatalf("the quiet queue counted %d disk waits, want 1", st)
	}
}

// TestAdmissionUnboundedIssuesWhatWaits proves that lifting the share (the
// last bounded queue leaves, or the knob says unbounded) issues what waits
// at once, so nothing stays held without a slot to wait for.
func TestAdmissionUnboundedIssuesWhatWaits(t *testing.T) {
	s := hostThread(t, 2*QueueCost(16), 2)
	l, _ := hostQueue(t, s, 16, TargetFile)
	s.admitCap = 2
	for tag := range uint16(16) {
		setDesc(l, tag, uapi.IOOpRead, 8, uint64(tag)*8)
		if err := l.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
	}
	if l.waitLen != 14 {
		t.Fatalf("%d held, want 14", l.waitLen)
	}
	s.setAdmitCap() // no queue asks for a bound
	if l.waitLen != 0 || l.backing != 16 || len(s.admitting) != 0 {
		t.Fatalf("after the bound was lifted: %d held, %d issued, %d queues waiting", l.waitLen, l.backing, len(s.admitting))
	}
}
