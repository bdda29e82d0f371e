package ublk

import (
	"errors"
	"os"
	"slices"
	"testing"
)

func TestChooseTuning(t *testing.T) {
	cases := []struct {
		name    string
		in      TuningInput
		want    Tuning
		wantErr bool
	}{
		{"one cpu copy", TuningInput{CPUs: 1}, Tuning{Queues: 1, Depth: 64, MaxIOBytes: 128 << 10, BufferBytes: 8 << 20}, false},
		{"two cpus copy keeps depth 64", TuningInput{CPUs: 2}, Tuning{Queues: 2, Depth: 64, MaxIOBytes: 128 << 10, BufferBytes: 16 << 20}, false},
		{"eight cpus copy capped at four queues, depth shrinks", TuningInput{CPUs: 8}, Tuning{Queues: 4, Depth: 32, MaxIOBytes: 128 << 10, BufferBytes: 16 << 20}, false},
		{"64 cpus copy", TuningInput{CPUs: 64}, Tuning{Queues: 4, Depth: 32, MaxIOBytes: 128 << 10, BufferBytes: 16 << 20}, false},
		{"zero copy ignores budget", TuningInput{CPUs: 8, ZeroCopy: true}, Tuning{Queues: 4, Depth: 64, MaxIOBytes: 1 << 20, ZeroCopy: true}, false},
		{"small budget removes queues", TuningInput{CPUs: 4, MemoryBudget: 2 << 20}, Tuning{Queues: 1, Depth: 16, MaxIOBytes: 128 << 10, BufferBytes: 2 << 20}, false},
		{"large budget", TuningInput{CPUs: 2, MemoryBudget: 64 << 20}, Tuning{Queues: 2, Depth: 64, MaxIOBytes: 128 << 10, BufferBytes: 16 << 20}, false},
		{"depth override kept, queues shrink", TuningInput{CPUs: 4, Depth: 128}, Tuning{Queues: 1, Depth: 128, MaxIOBytes: 128 << 10, BufferBytes: 16 << 20}, false},
		{"queues override kept, depth shrinks", TuningInput{CPUs: 4, Queues: 3}, Tuning{Queues: 3, Depth: 32, MaxIOBytes: 128 << 10, BufferBytes: 12 << 20}, false},
		{"both overrides", TuningInput{CPUs: 2, Queues: 1, Depth: 8}, Tuning{Queues: 1, Depth: 8, MaxIOBytes: 128 << 10, BufferBytes: 1 << 20}, false},
		{"queues above cpus", TuningInput{CPUs: 2, Queues: 3}, Tuning{}, true},
		{"negative queues", TuningInput{CPUs: 2, Queues: -1}, Tuning{}, true},
		{"max i/o override counts in the budget", TuningInput{CPUs: 2, MaxIOBytes: 512 << 10}, Tuning{Queues: 2, Depth: 16, MaxIOBytes: 512 << 10, BufferBytes: 16 << 20}, false},
		{"max i/o override ignored with zero copy", TuningInput{CPUs: 2, ZeroCopy: true, MaxIOBytes: 4096}, Tuning{Queues: 2, Depth: 64, MaxIOBytes: 1 << 20, ZeroCopy: true}, false},
		{"max i/o not a multiple of 4 KiB", TuningInput{CPUs: 2, MaxIOBytes: 6000}, Tuning{}, true},
		{"max i/o above 1 MiB", TuningInput{CPUs: 2, MaxIOBytes: 2 << 20}, Tuning{}, true},
		{"depth not power of two", TuningInput{CPUs: 2, Depth: 48}, Tuning{}, true},
		{"depth above kernel max", TuningInput{CPUs: 2, Depth: 8192}, Tuning{}, true},
		{"overrides above hard cap", TuningInput{CPUs: 8, Queues: 8, Depth: 4096}, Tuning{}, true},
		{"zero cpus", TuningInput{CPUs: 0}, Tuning{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ChooseTuning(c.in)
			if c.wantErr {
				if !errors.Is(err, os.ErrInvalid) {
					t.Fatalf("err = %v, want os.ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestSpreadQueues pins how a device's queues are spread over server
// threads: each on the least loaded thread the device does not use yet,
// then the least loaded again; failed and full threads never.
func TestSpreadQueues(t *testing.T) {
	for _, c := range []struct {
		name          string
		loads         []int
		queues, cost  int
		capacity      int
		want          []int
		wantThreadErr bool
	}{
		{"empty, two queues on two threads", []int{0, 0}, 2, 10, 100, []int{0, 1}, false},
		{"least loaded first", []int{30, 10, 20}, 2, 10, 100, []int{1, 2}, false},
		{"more queues than threads: least loaded again", []int{0, 0}, 4, 10, 100, []int{0, 1, 0, 1}, false},
		{"failed thread skipped", []int{-1, 50}, 2, 10, 100, []int{1, 1}, false},
		{"full thread skipped", []int{95, 0}, 2, 10, 100, []int{1, 1}, false},
		{"no room anywhere", []int{95, 95}, 1, 10, 100, nil, true},
		{"balances a second device", []int{10, 0, 10, 0}, 2, 10, 100, []int{1, 3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := SpreadQueues(c.loads, c.queues, c.cost, c.capacity)
			if c.wantThreadErr {
				if !errors.Is(err, ErrThreadFull) {
					t.Fatalf("SpreadQueues = %v, %v; want ErrThreadFull", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("SpreadQueues = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestRangeAlloc pins the buffer-slot allocator: first fit, and runs given
// back merge with their neighbours so a full table can be handed out again.
func TestRangeAlloc(t *testing.T) {
	a := newRangeAlloc(100)
	x, _ := a.alloc(30)
	y, _ := a.alloc(30)
	z, _ := a.alloc(40)
	if x != 0 || y != 30 || z != 60 {
		t.Fatalf("allocs at %d %d %d, want 0 30 60", x, y, z)
	}
	if _, ok := a.alloc(1); ok {
		t.Fatal("alloc from a full table succeeded")
	}
	a.free(y, 30)
	if s, ok := a.alloc(31); ok {
		t.Fatalf("alloc(31) from a hole of 30 gave %d", s)
	}
	a.free(x, 30)
	a.free(z, 40)
	if s, ok := a.alloc(100); !ok || s != 0 {
		t.Fatalf("after every run came back, alloc(100) = %d, %v", s, ok)
	}
}
