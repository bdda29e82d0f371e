package dataplane

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// TestLoopPoll proves the poll path: after a busy round a completion that
// is already there is picked up without sleeping in io_uring_enter, and
// with nothing in flight the poll gives up after its budget.
// TestLoopPollInFlight proves the bound on polling by requests in service:
// with more than pollMaxInFlight the thread sleeps in io_uring_enter
// rather than poll, and ThreadConfig.PollInFlight (--ublk-poll-inflight)
// raises the bound so that it polls.
func TestLoopPollInFlight(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	l.cfg.Options.Poll = time.Second
	l.s.setPollWindow()
	others := pollMaxInFlight // requests of other queues in service
	for _, c := range []struct {
		pollMax int
		enters  uint64 // waits in io_uring_enter for the completion
	}{{0, 1}, {pollMaxInFlight + others, 0}} {
		l.s.pollMax = c.pollMax
		l.s.gapNs = int64(100 * time.Millisecond) // completions come within Poll
		setDesc(l, 0, uapi.IOOpRead, 8, 0)
		if err := l.onCmd(0, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
		l.s.serving += others
		before := l.s.t.stats.enters.Load()
		if n, err := l.s.next(true); err != nil || n != 1 {
			t.Fatalf("pollMax %d: next(busy) = %d, %v; want the backing completion", c.pollMax, n, err)
		}
		if e := l.s.t.stats.enters.Load() - before; e != c.enters {
			t.Errorf("pollMax %d with %d requests in service: %d waits in io_uring_enter, want %d",
				c.pollMax, l.s.serving, e, c.enters)
		}
		l.s.serving -= others
		if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
			t.Fatal(err)
		}
		// The COMMIT fails at once on a regular file; reap it.
		if n, err := l.s.next(true); err != nil || n != 1 {
			t.Fatalf("next(busy) = %d, %v; want the commit's completion", n, err)
		}
	}
}

func TestLoopPoll(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	l.cfg.Options.Poll = time.Second
	l.s.setPollWindow()
	l.s.gapNs = int64(100 * time.Millisecond) // completions come within Poll
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	if err := l.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	n, err := l.s.next(true)
	if err != nil || n != 1 {
		t.Fatalf("next(busy) = %d, %v; want the backing completion", n, err)
	}
	if e := l.s.t.stats.enters.Load(); e != 0 {
		t.Fatalf("%d waits in io_uring_enter, want none: the poll should have found the completion", e)
	}
	if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
		t.Fatal(err)
	}
	// The COMMIT fails at once on a regular file; reap it.
	if n, err := l.s.next(true); err != nil || n != 1 {
		t.Fatalf("next(busy) = %d, %v; want the commit's completion", n, err)
	}
	if l.s.gapNs >= int64(100*time.Millisecond) {
		t.Fatalf("wait average %v did not move toward the measured waits", time.Duration(l.s.gapNs))
	}
	l.cfg.Options.Poll, l.s.gapNs = 20*time.Millisecond, int64(10*time.Millisecond)
	l.s.setPollWindow()
	start := time.Now()
	if n, err := l.s.next(true); err != nil || n != 0 {
		t.Fatalf("next with nothing in flight = %d, %v", n, err)
	}
	if took := time.Since(start); took < l.cfg.Options.Poll {
		t.Fatalf("idle poll returned after %v, before its %v budget", took, l.cfg.Options.Poll)
	}
	if e := l.s.t.stats.enters.Load(); e != 1 {
		t.Fatalf("%d waits after an empty poll, want 1", e)
	}
	// Completions that usually take longer than Poll: no polling at all.
	l.s.gapNs = int64(time.Second)
	start = time.Now()
	if n, err := l.s.next(true); err != nil || n != 0 {
		t.Fatalf("next with nothing in flight = %d, %v", n, err)
	}
	if took := time.Since(start); took >= l.cfg.Options.Poll {
		t.Fatalf("next polled %v although completions come slower than Poll", took)
	}
}

// TestWaitFor pins the batched wait of a thread where no request can
// arrive: one completion when little is in flight, a quarter of the
// backing I/O when much is.
func TestWaitFor(t *testing.T) {
	for _, c := range []struct {
		backing int
		want    uint32
	}{{0, 1}, {1, 1}, {7, 1}, {8, 2}, {32, 8}, {64, 16}} {
		if got := (&threadLoop{backing: c.backing}).waitFor(); got != c.want {
			t.Errorf("waitFor with %d backing = %d, want %d", c.backing, got, c.want)
		}
	}
}

// TestWaitForNews pins the wait while requests can arrive: one completion
// whatever backing I/O is in flight, and the quarter of it once every tag
// is in service.
func TestWaitForNews(t *testing.T) {
	for _, c := range []struct {
		name    string
		parked  int
		backing int
		want    uint32
	}{
		{"idle", 64, 0, 1},
		{"busy, tags parked", 32, 256, 1},
		{"every tag in service", 0, 256, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &threadLoop{parked: c.parked, backing: c.backing}
			if got := s.waitFor(); got != c.want {
				t.Fatalf("waitFor = %d, want %d", got, c.want)
			}
		})
	}
}

// TestBatchWaitFor pins the wait of a thread with batch-mode queues: one
// CQE of news while a FETCH is armed (not a quarter of the backing I/O),
// plus one per PREP/COMMIT that owes its CQE; without an armed FETCH, the
// usual quarter of the backing I/O.
func TestBatchWaitFor(t *testing.T) {
	for _, c := range []struct {
		name     string
		fetchers int
		backing  int
		owed     int
		want     uint32
	}{
		{"idle", 1, 0, 0, 1},
		{"busy, commit sent", 1, 32, 1, 2},
		{"two queues busy, two commits sent", 2, 64, 2, 3},
		{"fetch ended, backing in flight", 0, 3, 0, 1},
		{"fetch ended, much backing in flight", 0, 32, 0, 8},
		{"fetch ended, last commit sent", 0, 0, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &threadLoop{fetchers: c.fetchers, backing: c.backing, batchCmds: c.owed}
			if got := s.waitFor(); got != c.want {
				t.Fatalf("waitFor = %d, want %d", got, c.want)
			}
		})
	}
}

// TestNewRequestDoesNotWaitForOtherBacking proves that a thread whose
// queues can receive requests wakes for the first one, whatever backing
// I/O of other devices is in flight: device A's backing reads are stalled
// (reads of a pipe nobody writes to: a backing file that hangs) and a
// request of device B arrives (its parked FETCH completes; here a poll
// standing in for the uring_cmd, which a regular file cannot park). Before,
// the thread waited for a quarter of A's backing I/O first, and B's request
// waited as long as A's file stalled: here until the test released A's
// reads after a few seconds.
func TestNewRequestDoesNotWaitForOtherBacking(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	const stalled = 16
	buf := make([]byte, 512)
	for i := range stalled {
		sqe := s.ring.GetSQE()
		sqe.PrepRead(int32(pr.Fd()), buf, ^uint64(0))    // a pipe has no offset
		sqe.UserData = encodeUD(udBacking, 0, uint16(i)) // slot 0: device A
		s.backing++
	}
	news, err := uring.NewWaker()
	if err != nil {
		t.Fatal(err)
	}
	defer news.Close()
	news.PrepPoll(s.ring.GetSQE(), encodeUD(udCmd, l.slot, 0))
	s.parked++ // device B's tag 0 waits for a request
	if err := news.Wake(); err != nil {
		t.Fatal(err)
	}
	// The bound of a wait that would never end: A's reads complete.
	release := time.AfterFunc(3*time.Second, func() { pw.Write(make([]byte, stalled*len(buf))) })
	n, err := s.next(false)
	released := !release.Stop()
	if err != nil {
		t.Fatal(err)
	}
	gotNews := false
	for _, c := range s.cqes[:n] {
		kind, slot, _ := decodeUD(c.UserData)
		gotNews = gotNews || (kind == udCmd && slot == l.slot)
	}
	if !gotNews || released {
		t.Fatalf("device B's request came back with %d CQEs (it did: %v) only after device A's stalled backing reads were released (%v): it waited for them",
			n, gotNews, released)
	}
}

// TestLoopOffersBeforeSleeping proves a round with an offer due still
// submits its backing I/O and gets the completion, and records the offer;
// a round right after an offer does not offer again.
func TestLoopOffersBeforeSleeping(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	for round := range 2 {
		setDesc(l, 0, uapi.IOOpRead, 8, 0)
		if err := l.onCmd(0, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
		l.s.offeredAt = monoNow() - int64(uring.OfferInterval) // due
		if round == 1 {
			l.s.offeredAt = monoNow() // just offered: not due again
		}
		before := l.s.offeredAt
		n, err := l.s.next(true)
		if err != nil || n != 1 {
			t.Fatalf("round %d: next = %d, %v; want the backing completion", round, n, err)
		}
		if offered := l.s.offeredAt != before; offered != (round == 0) {
			t.Fatalf("round %d: offered = %v, want %v", round, offered, round == 0)
		}
		if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
			t.Fatal(err)
		}
		if n, err := l.s.next(true); err != nil || n != 1 { // the failed COMMIT of a regular file
			t.Fatalf("round %d: next = %d, %v; want the commit's completion", round, n, err)
		}
	}
}

// TestWaitForAllTagsInServiceIsBounded: with every tag of the thread in
// service (no request can arrive), the sleeping wait asks for a quarter of
// the backing operations in flight. Here one of eight is done at once and
// seven (another device's, whose backing file stalls: polls on an empty
// pipe) finish only after two seconds. The wait must hand over the finished
// one within a bound of about a millisecond, not when the stalled ones end.
// Before, it slept until they did.
func TestWaitForAllTagsInServiceIsBounded(t *testing.T) {
	s := hostThread(t, 64, 1)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	const stalled = 7
	for i := range stalled + 1 {
		sqe := s.ring.GetSQE()
		if i == 0 {
			sqe.PrepNop()
		} else {
			sqe.PrepPollAdd(int32(p[0]), unix.POLLIN)
		}
		sqe.UserData = encodeUD(udBacking, 1, uint16(i))
	}
	s.backing = stalled + 1 // every tag in service: none parked
	if want := s.waitFor(); want != 2 {
		t.Fatalf("waitFor = %d, want 2 (a quarter of 8)", want)
	}
	timer := time.AfterFunc(2*time.Second, func() { unix.Write(p[1], []byte{1}) })
	defer timer.Stop()
	start := time.Now()
	n, err := s.wait(monoNow())
	took := time.Since(start)
	if err != nil || n < 1 {
		t.Fatalf("wait = %d, %v", n, err)
	}
	if took > time.Second {
		t.Fatalf("the finished completion waited %v for the stalled ones (bound %v)", took, batchWaitMax)
	}
	// Let the stalled polls end before the ring closes.
	for got := n; got < stalled+1; {
		if _, err := s.ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		got += s.ring.Reap(s.cqes)
	}
}
