package dataplane

import (
	"errors"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// TestDetachForgetsQueue proves that a queue that leaves its thread is off
// every list the thread keeps: the idle reclaim once reached the unmapped
// buffers of a detached copy-mode queue and panicked the thread (seen with
// 64 volumes in the VM).
func TestDetachForgetsQueue(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.cfg.Options.IdleReclaim = time.Millisecond
	l.tailsUsed, l.tailsAt = true, monoNow()-int64(time.Hour)
	l.inTails, s.tails = true, append(s.tails, l)
	s.detach(l, nil)
	if len(s.tails)+len(s.held)+len(s.commits)+len(s.ending) != 0 {
		t.Fatalf("detached queue still listed: tails %d held %d commits %d ending %d", len(s.tails), len(s.held), len(s.commits), len(s.ending))
	}
	s.reclaimIdle() // panicked on the unmapped buffers before
}

// TestPanicFailsOnlyItsQueue proves that a panic while one queue handles a
// completion fails that queue, with the cause, and the thread goes on with
// the round's other completions.
func TestPanicFailsOnlyItsQueue(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.bufs.close() // a broken queue: its next read copies into nothing
	l.bufs = nil
	l.zc = false
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	s.cqes[0] = uring.CQE{UserData: encodeUD(udCmd, l.slot, 0), Res: uapi.IOResOK}
	s.cqes[1] = uring.CQE{UserData: encodeUD(udCmd, 7, 0)} // a stray: handled after
	before := s.t.stats.stray.Load()
	s.dispatch(2)
	if err := l.q.Err(); !errors.Is(err, errQueuePanic) {
		t.Fatalf("queue error %v, want a panic failure", err)
	}
	if s.t.stats.stray.Load() != before+1 {
		t.Fatal("the round's next completion was not handled after the panic")
	}
}

// TestReclaimBacksOffWhileRingBusy proves that an idle queue's reclaim,
// refused because other completions are waiting in the shared ring, is
// tried again only after reclaimRetry: before, every round retried it with
// an extra system call and every wait was cut to a millisecond, which cost
// the plugin more CPU per I/O with 64 busy volumes than with 16.
func TestReclaimBacksOffWhileRingBusy(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.cfg.Options.IdleReclaim = time.Millisecond
	l.tailsUsed, l.tailsAt = true, monoNow()-int64(time.Hour)
	l.inTails, s.tails = true, append(s.tails, l)
	sqe := s.ring.GetSQE() // another queue's completion, waiting in the ring
	sqe.PrepNop()
	if _, err := s.ring.SubmitAndWait(1, time.Second); err != nil {
		t.Fatal(err)
	}
	s.reclaimIdle()
	if !l.tailsUsed || len(s.tails) != 1 {
		t.Fatal("reclaimed while a completion was waiting in the ring")
	}
	if w := s.reclaimWait(monoNow()); w < reclaimRetry/2 {
		t.Fatalf("after a refused reclaim the wait is bounded to %v, want about %v", w, reclaimRetry)
	}
	s.ring.Reap(s.cqes)
	s.reclaimRetryAt = 0
	s.reclaimIdle()
	if l.tailsUsed || len(s.tails) != 0 {
		t.Fatal("not reclaimed once the ring was quiet")
	}
}

// TestLightFirstOrdersRound proves the light-first design's order: the
// completions of queues with few backing operations in flight first, then
// the busy queues', each side in ring order, none lost or duplicated.
func TestLightFirstOrdersRound(t *testing.T) {
	busy, quiet := &queueState{backing: 3 * lightBacking}, &queueState{backing: 1}
	s := &threadLoop{slots: []*queueState{busy, quiet}, cqes: make([]uring.CQE, 8)}
	order := []struct {
		slot, tag uint16
	}{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {0, 3}}
	for i, c := range order {
		s.cqes[i] = uring.CQE{UserData: encodeUD(udBacking, c.slot, c.tag)}
	}
	s.lightFirst(len(order))
	want := []struct{ slot, tag uint16 }{{1, 0}, {1, 1}, {0, 0}, {0, 1}, {0, 2}, {0, 3}}
	for i, w := range want {
		if _, slot, tag := decodeUD(s.cqes[i].UserData); slot != w.slot || tag != w.tag {
			t.Fatalf("cqe %d is slot %d tag %d, want slot %d tag %d", i, slot, tag, w.slot, w.tag)
		}
	}
}
