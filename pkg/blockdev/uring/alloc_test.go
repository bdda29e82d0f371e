package uring

import (
	"runtime"
	"testing"
	"time"
)

// TestZeroAllocsPerIO asserts the hot path (GetSQE, prep, SubmitAndWait,
// Reap) allocates nothing per I/O, with and without a timeout and through
// the pending queue.
func TestZeroAllocsPerIO(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, CQEntries: 4, Flags: QueueFlags})
	if err := r.RegisterRingFD(); err != nil {
		t.Fatal(err)
	}
	f := directFile(t, 8*blk)
	fd := int32(f.Fd())
	bufs := newBuffers(t, 8, blk)
	if err := r.RegisterFiles([]int32{fd}); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterBuffers(bufs.Slots()); err != nil {
		t.Fatal(err)
	}
	cqes := make([]CQE, 16)
	i := 0
	cases := []struct {
		name  string
		batch int
		to    time.Duration
	}{
		{"one read", 1, 0},
		{"one read with timeout", 1, time.Second},
		{"batch of 8 via pending", 8, 0},
	}
	for _, c := range cases {
		allocs := testing.AllocsPerRun(500, func() {
			for range c.batch {
				s := r.GetSQE()
				s.PrepReadFixed(0, bufs.Slot(i%8), uint64(i%8)*blk, uint16(i%8))
				s.Flags |= IOSQE_FIXED_FILE
				s.UserData = uint64(i)
				i++
			}
			for done := 0; done < c.batch; {
				if _, err := r.SubmitAndWait(uint32(c.batch-done), c.to); err != nil {
					t.Fatal(err)
				}
				done += r.Reap(cqes)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per run, want 0", c.name, allocs)
		}
	}
}

func BenchmarkNop(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := New(Config{Entries: 64, Flags: QueueFlags})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	cqes := make([]CQE, 64)
	b.ReportAllocs()
	for b.Loop() {
		for range 32 {
			r.GetSQE().PrepNop()
		}
		for done := 0; done < 32; done += r.Reap(cqes) {
			if _, err := r.SubmitAndWait(32, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
}
