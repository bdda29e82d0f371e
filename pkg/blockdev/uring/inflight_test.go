package uring

import (
	"testing"
	"time"
)

// TestManyOutstanding keeps far more I/O outstanding than the SQ and CQ
// hold, through the engine's pending queue, and checks that every request
// completes exactly once and the kernel never overflowed its CQ.
func TestManyOutstanding(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	cases := []struct {
		name string
		cfg  Config
		read bool
	}{
		{"nop sqe64", Config{Entries: 8, CQEntries: 16, Flags: QueueFlags}, false},
		{"nop sqe128", Config{Entries: 4, CQEntries: 8, Flags: IORING_SETUP_SQE128 | QueueFlags, PendingEntries: 5}, false},
		{"read o_direct", Config{Entries: 8, CQEntries: 16, Flags: QueueFlags, PendingEntries: 100}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lockThread(t)
			r := newRing(t, c.cfg)
			f := directFile(t, 64*blk)
			bufs := newBuffers(t, 64, blk)
			seen := make([]bool, n)
			cqes := make([]CQE, 64)
			issued, done := 0, 0
			deadline := time.Now().Add(60 * time.Second)
			for done < n {
				if time.Now().After(deadline) {
					t.Fatalf("hung: %d issued, %d done, %d in flight, %d pending", issued, done, r.InFlight(), r.Pending())
				}
				for issued < n {
					s := r.GetSQE()
					if s == nil {
						break
					}
					if c.read {
						s.PrepRead(int32(f.Fd()), bufs.Slot(issued%64), uint64(issued%64)*blk)
					} else {
						s.PrepNop()
					}
					s.UserData = uint64(issued)
					issued++
				}
				if _, err := r.SubmitAndWait(4, 0); err != nil {
					t.Fatal(err)
				}
				if r.InFlight() > r.CQEntries() {
					t.Fatalf("in flight %d exceeds CQ %d", r.InFlight(), r.CQEntries())
				}
				for _, c := range cqes[:r.Reap(cqes)] {
					if seen[c.UserData] {
						t.Fatalf("user_data %d completed twice", c.UserData)
					}
					if c.Res < 0 {
						t.Fatalf("user_data %d failed: %d", c.UserData, c.Res)
					}
					seen[c.UserData] = true
					done++
				}
			}
			if ov := *r.cqOverflow; ov != 0 {
				t.Errorf("kernel dropped %d CQEs", ov)
			}
			if r.InFlight() != 0 || r.Pending() != 0 {
				t.Errorf("left: %d in flight, %d pending", r.InFlight(), r.Pending())
			}
		})
	}
}

// TestPendingFull checks that GetSQE reports a full pending queue with nil
// rather than dropping, and that everything completes afterwards.
func TestPendingFull(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 2, CQEntries: 2, PendingEntries: 3, Flags: QueueFlags})
	got := 0
	for s := r.GetSQE(); s != nil; s = r.GetSQE() {
		s.PrepNop()
		got++
	}
	if got != 5 { // 2 in the SQ + 3 pending
		t.Fatalf("GetSQE handed out %d, want 5", got)
	}
	cqes := make([]CQE, 8)
	reaped := 0
	deadline := time.Now().Add(10 * time.Second)
	for reaped < got && time.Now().Before(deadline) {
		if _, err := r.SubmitAndWait(1, time.Second); err != nil {
			t.Fatal(err)
		}
		reaped += r.Reap(cqes)
	}
	if reaped != got {
		t.Fatalf("reaped %d of %d", reaped, got)
	}
}

// TestUnboundedOverflows proves what Config.Unbounded (a benchmark
// ablation) does: with the in-flight bound lifted, more operations than the
// CQ holds go to the kernel at once, the excess CQEs take the kernel's
// overflow list, and Reap still delivers every one of them, none lost.
func TestUnboundedOverflows(t *testing.T) {
	lockThread(t)
	const cq, ops = 4, 64
	r := newRing(t, Config{Entries: cq, CQEntries: cq, PendingEntries: ops, Flags: QueueFlags, Unbounded: true})
	for range ops {
		s := r.GetSQE()
		if s == nil {
			t.Fatal("GetSQE returned nil")
		}
		s.PrepNop()
	}
	// Everything goes in before anything is reaped: NOPs complete at
	// once, so all but the first cq of their CQEs overflow.
	for i := 0; r.Pending() > 0 || r.Unsubmitted() > 0; i++ {
		if _, err := r.Submit(); err != nil {
			t.Fatal(err)
		}
		if i > ops {
			t.Fatalf("%d pending, %d unsubmitted after %d submits", r.Pending(), r.Unsubmitted(), i)
		}
	}
	maxInFlight := r.InFlight()
	cqes := make([]CQE, ops)
	reaped := 0
	deadline := time.Now().Add(10 * time.Second)
	for reaped < ops && time.Now().Before(deadline) {
		reaped += r.Reap(cqes)
	}
	if reaped != ops {
		t.Fatalf("reaped %d of %d", reaped, ops)
	}
	if maxInFlight <= cq {
		t.Fatalf("at most %d in flight with a CQ of %d: the bound was not lifted", maxInFlight, cq)
	}
	t.Logf("%d in flight at most on a CQ of %d", maxInFlight, cq)
}
