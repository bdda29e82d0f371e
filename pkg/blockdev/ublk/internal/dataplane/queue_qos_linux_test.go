package dataplane

import (
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// limitedLoop is a host loop of depth 8 paced by lim.
func limitedLoop(t *testing.T, lim qos.Limits) *queueState {
	l, _ := hostLoop(t, 8, TargetFile)
	l.cfg.Limiter = qos.New(lim)
	l.held = make([]uint16, 8)
	l.limGen = l.cfg.Limiter.Gen()
	return l
}

// arrive hands reads of 4 KiB to tags first..first+n-1, as FETCH completions.
func arrive(t *testing.T, l *queueState, first, n uint16) {
	t.Helper()
	for tag := first; tag < first+n; tag++ {
		setDesc(l, tag, uapi.IOOpRead, 8, uint64(tag)*8)
		if err := l.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatalf("onCmd(%d): %v", tag, err)
		}
	}
}

func TestLoopHoldsRequestsBeyondTheLimit(t *testing.T) {
	// 100 IOPS: the 50 ms burst and the request due now let 6 requests
	// start at once, then one every 10 ms.
	l := limitedLoop(t, qos.Limits{IOPS: 100})
	arrive(t, l, 0, 8)
	if l.backing != 6 || l.heldLen != 2 {
		t.Fatalf("8 requests at once under 100 IOPS: %d issued, %d held; want 6 and 2", l.backing, l.heldLen)
	}
	// The times come from the bookings, not the clock: the test reads when
	// the held requests fall due, so a slow machine cannot move them.
	first := l.tags[l.held[l.heldHead]].due
	second := l.tags[l.held[(l.heldHead+1)%len(l.held)]].due
	if gap := time.Duration(second - first); gap != 10*time.Millisecond {
		t.Fatalf("held requests booked %v apart, want 10ms at 100 IOPS", gap)
	}
	now := first - int64(5*time.Millisecond)
	if w := l.heldWait(now); w != 5*time.Millisecond {
		t.Fatalf("wait bound 5 ms before the first held request is due = %v", w)
	}
	if err := l.release(now); err != nil || l.heldLen != 2 {
		t.Fatalf("release before anything is due: err %v, %d held, want 2", err, l.heldLen)
	}
	// When the first is due, the second (10 ms later) is not.
	if err := l.release(first); err != nil || l.heldLen != 1 || l.backing != 7 {
		t.Fatalf("release when the first is due: err %v, %d held, %d issued; want 1 and 7", err, l.heldLen, l.backing)
	}
	if got := l.held[l.heldHead]; got != 7 {
		t.Fatalf("next held tag = %d, want 7 (booking order)", got)
	}
	if err := l.release(second + int64(time.Second)); err != nil || l.heldLen != 0 || l.backing != 8 {
		t.Fatalf("release at +1 s: err %v, %d held, %d issued; want 0 and 8", err, l.heldLen, l.backing)
	}
	if w := l.heldWait(now); w != 0 {
		t.Fatalf("wait bound with nothing held = %v, want none", w)
	}
	st := l.statsNow()
	if st.Throttled != 2 || st.ThrottledNs == 0 {
		t.Fatalf("stats: %d throttled for %d ns; want 2 and some time", st.Throttled, st.ThrottledNs)
	}
}

func TestLoopRaisedLimitFreesHeldRequests(t *testing.T) {
	l := limitedLoop(t, qos.Limits{IOPS: 1}) // 1 IOPS: a burst of 0, one per second
	arrive(t, l, 0, 4)
	if l.heldLen < 3 {
		t.Fatalf("4 requests at 1 IOPS: %d held, want at least 3", l.heldLen)
	}
	l.cfg.Limiter.Set(qos.Limits{})
	if err := l.release(monoNow()); err != nil || l.heldLen != 0 || l.backing != 4 {
		t.Fatalf("after lifting the limit: err %v, %d held, %d issued; want 0 and 4", err, l.heldLen, l.backing)
	}
}

func TestLoopPacesOnlyReadsAndWrites(t *testing.T) {
	l := limitedLoop(t, qos.Limits{IOPS: 1})
	arrive(t, l, 0, 2) // 1 IOPS: the burst holds 0.05 requests, so the second waits
	held := l.heldLen
	setDesc(l, 5, uapi.IOOpFlush, 0, 0)
	if err := l.onCmd(5, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	setDesc(l, 6, uapi.IOOpDiscard, 8, 0)
	if err := l.onCmd(6, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	if l.heldLen != held {
		t.Fatalf("a flush and a discard were held (%d → %d): only reads and writes are paced", held, l.heldLen)
	}
}

func TestLoopDispatchAllocsWithLimiter(t *testing.T) {
	l := limitedLoop(t, qos.Limits{IOPS: 1 << 40})
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	serveOne(t, l, 0)
	if n := testing.AllocsPerRun(200, func() { serveOne(t, l, 0) }); n != 0 {
		t.Fatalf("%v allocations per paced request", n)
	}
}

// TestLoopBooksOnceAfterAChange proves that requests held after a change of
// limits (made while nothing was held) are booked once: release must not
// book them again, which would push them and everything after them back.
func TestLoopBooksOnceAfterAChange(t *testing.T) {
	l := limitedLoop(t, qos.Limits{IOPS: 100})
	l.cfg.Limiter.Set(qos.Limits{IOPS: 100}) // a new generation, nothing held
	arrive(t, l, 0, 8)
	if l.heldLen != 2 {
		t.Fatalf("%d held, want 2", l.heldLen)
	}
	due := []int64{l.tags[6].due, l.tags[7].due}
	if err := l.release(monoNow()); err != nil {
		t.Fatal(err)
	}
	if got := []int64{l.tags[6].due, l.tags[7].due}; got[0] != due[0] || got[1] != due[1] {
		t.Fatalf("held requests booked again without a change since: starts %v → %v", due, got)
	}
}
