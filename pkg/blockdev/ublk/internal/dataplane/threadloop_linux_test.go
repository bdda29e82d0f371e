package dataplane

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// TestLightFirstOrdersRound proves the order of a fair round: the
// completions of queues with few backing operations in flight first, then
// the busy queues', each side in ring order, none lost or duplicated.
func TestLightFirstOrdersRound(t *testing.T) {
	busy, quiet := &queueState{tally: queueTally{inFlight: 3 * lightRequests}}, &queueState{tally: queueTally{inFlight: 1}}
	s := &threadLoop{slots: []*queueState{busy, quiet}, cqes: make([]uring.CQE, 8)}
	order := []struct {
		slot, tag uint16
	}{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {0, 3}}
	for i, c := range order {
		s.cqes[i] = uring.CQE{UserData: encodeUD(udBacking, c.slot, c.tag)}
	}
	if light := s.lightFirst(len(order)); light != 2 {
		t.Fatalf("lightFirst = %d light CQEs, want 2", light)
	}
	want := []struct{ slot, tag uint16 }{{1, 0}, {1, 1}, {0, 0}, {0, 1}, {0, 2}, {0, 3}}
	for i, w := range want {
		if _, slot, tag := decodeUD(s.cqes[i].UserData); slot != w.slot || tag != w.tag {
			t.Fatalf("cqe %d is slot %d tag %d, want slot %d tag %d", i, slot, tag, w.slot, w.tag)
		}
	}
}

// TestFairRoundServesQuietQueueFirst proves a fair round on the host's
// io_uring: with 64 backing reads of a busy queue completed ahead of one of
// a quiet queue, the round handles the quiet one first and its COMMIT
// reaches the kernel before any busy queue's, handles only roundBusyCQEs
// of the busy queue's and keeps the rest, in ring order, for the next
// round, which looks at the ring again without waiting.
func TestFairRoundServesQuietQueueFirst(t *testing.T) {
	const busyDepth = 64
	s := hostThread(t, QueueCost(4)+QueueCost(busyDepth), 2)
	quiet, _ := hostQueue(t, s, 4, TargetFile)
	busy, _ := hostQueue(t, s, busyDepth, TargetFile)
	for tag := range uint16(busyDepth) {
		setDesc(busy, tag, uapi.IOOpRead, 8, uint64(tag)*8)
		if err := busy.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
	}
	waitReady(t, s, busyDepth)
	setDesc(quiet, 0, uapi.IOOpRead, 8, 0)
	if err := quiet.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	waitReady(t, s, busyDepth+1) // the quiet queue's read is the ring's last CQE
	n, err := s.reap()
	if err != nil || n != busyDepth+1 {
		t.Fatalf("reap = %d, %v; want %d", n, err, busyDepth+1)
	}

	s.dispatch(n)
	// A COMMIT on a regular file fails at once: the ring holds the CQE of
	// every COMMIT submitted so far.
	if got := s.ring.Ready(); got != 1 {
		t.Fatalf("%d COMMITs in the kernel after the round, want only the quiet queue's", got)
	}
	if got := s.ring.Unsubmitted(); got != roundBusyCQEs {
		t.Fatalf("%d SQEs wait for the next enter, want the busy queue's %d COMMITs", got, roundBusyCQEs)
	}
	if s.backlog != busyDepth-roundBusyCQEs {
		t.Fatalf("backlog = %d, want %d", s.backlog, busyDepth-roundBusyCQEs)
	}
	for i, c := range s.cqes[:s.backlog] {
		if kind, slot, tag := decodeUD(c.UserData); kind != udBacking || slot != busy.slot || tag != uint16(roundBusyCQEs+i) {
			t.Fatalf("backlog[%d] = kind %d slot %d tag %d, want the busy queue's read of tag %d", i, kind, slot, tag, roundBusyCQEs+i)
		}
	}

	start := time.Now()
	n, err = s.next(true)
	if err != nil {
		t.Fatal(err)
	}
	// The backlog, then the quiet COMMIT's CQE and the busy ones' just submitted.
	if want := busyDepth - roundBusyCQEs + 1 + roundBusyCQEs; n != want {
		t.Fatalf("next = %d CQEs, want %d (backlog first)", n, want)
	}
	if _, slot, tag := decodeUD(s.cqes[0].UserData); slot != busy.slot || tag != roundBusyCQEs {
		t.Fatalf("next round starts with slot %d tag %d, want the backlog's first", slot, tag)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("next waited %v with a backlog", d)
	}
}

// waitReady submits what s prepared and waits until its CQ holds n CQEs.
func waitReady(t *testing.T, s *threadLoop, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.ring.Ready() < n {
		if _, err := s.ring.SubmitAndWait(1, time.Second); err != nil && !errors.Is(err, unix.ETIME) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d CQEs ready, want %d", s.ring.Ready(), n)
		}
	}
}

// TestFailedAttachLeavesTheNextQueuesSlots: a queue whose setup fails on
// the thread (here its char device fd is not open) is torn down there, and
// then again by Queue.start on the caller's goroutine. The thread may by
// then have given the failed queue's slot to the next queue: the second
// teardown must not clear that queue's fixed files or buffers. Before, it
// did (from a foreign goroutine, on the thread's ring), and the next
// queue's I/O failed.
func TestFailedAttachLeavesTheNextQueuesSlots(t *testing.T) {
	s := hostThread(t, 4*QueueCost(4), 2)
	bad, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(bad) // a closed fd: registering it fails
	if err := s.t.reserve(4); err != nil {
		t.Fatal(err)
	}
	q := &Queue{cfg: QueueConfig{Depth: 4, CharFD: bad, MaxIOBytes: 64 << 10, Target: Target{Kind: TargetNull}},
		thread: s.t, done: make(chan struct{})}
	failed := newQueueState(q)
	failed.descs = &descArea{mem: make([]byte, 4*uapi.SizeofIODesc), depth: 4}
	if failed.bufs, err = mapBuffers(4, q.cfg.MaxIOBytes); err != nil {
		t.Fatal(err)
	}
	if err := s.attach(failed); err == nil {
		t.Fatal("attach of a queue with a closed char fd succeeded")
	}
	s.t.unreserve(4)
	next, f := hostQueue(t, s, 4, TargetFile)
	if next.slot != failed.slot {
		t.Fatalf("the next queue took slot %d, not the failed queue's %d: the test proves nothing", next.slot, failed.slot)
	}
	failed.teardown() // what Queue.start does after the failed attach
	roundTrip(t, next, f, bytes.Repeat([]byte("next q!\n"), 512), 8, 0)
}

// TestQuietRequestServedWithinBoundedWork proves the bound of a fair round
// on the host's io_uring, counted in work, not time: 512 backing reads of a
// busy queue have completed and wait in the thread, and a quiet queue's
// request arrives after the thread has reaped them and begun its round.
// The quiet request must be committed before the thread handles more than
// roundBusyCQEs of the busy queue's completions: the thread looks at its
// ring again after that many, finds the quiet request's completion and
// serves it first, whatever the busy backlog still holds.
func TestQuietRequestServedWithinBoundedWork(t *testing.T) {
	const busyDepth = 512
	s := hostThread(t, QueueCost(4)+QueueCost(busyDepth), 2)
	quiet, _ := hostQueue(t, s, 4, TargetFile)
	busy, _ := hostQueue(t, s, busyDepth, TargetFile)
	for tag := range uint16(busyDepth) {
		setDesc(busy, tag, uapi.IOOpRead, 8, uint64(tag%256)*8)
		if err := busy.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
	}
	waitReady(t, s, busyDepth)
	n, err := s.reap()
	if err != nil || n != busyDepth {
		t.Fatalf("reap = %d, %v; want %d", n, err, busyDepth)
	}
	s.dispatch(n) // the first round: busy work only
	handled := busy.tally.commits
	if handled > roundBusyCQEs {
		t.Fatalf("the first round handled %d busy completions, more than the bound %d", handled, roundBusyCQEs)
	}
	// The quiet request arrives while the busy backlog is pending.
	setDesc(quiet, 0, uapi.IOOpRead, 8, 0)
	if err := quiet.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	// Busy completions handled from its arrival until the round that
	// serves it, which handles the light queue's completions first.
	var waited uint64
	for rounds := 0; quiet.tally.commits == 0; rounds++ {
		if rounds > busyDepth {
			t.Fatal("the quiet request was never served")
		}
		n, err := s.next(true)
		if err != nil {
			t.Fatal(err)
		}
		before := busy.tally.commits
		s.dispatch(n)
		if quiet.tally.commits == 0 {
			waited += busy.tally.commits - before
		}
	}
	if waited > roundBusyCQEs {
		t.Fatalf("the quiet request waited for %d busy completions (backlog of %d), want at most %d",
			waited, busyDepth-int(handled), roundBusyCQEs)
	}
	t.Logf("quiet request served after %d busy completions of the %d pending (bound %d)", waited, busyDepth-int(handled), roundBusyCQEs)
}
