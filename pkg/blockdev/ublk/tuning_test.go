package ublk

import (
	"errors"
	"os"
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
		{"two cpus user copy takes 1 MiB, the pool gets the budget", TuningInput{CPUs: 2, UserCopy: true},
			Tuning{Queues: 2, Depth: 64, MaxIOBytes: 1 << 20, UserCopy: true, PoolBytes: 16 << 20, BufferBytes: 18 << 20}, false},
		{"eight cpus user copy keeps depth 64", TuningInput{CPUs: 8, UserCopy: true},
			Tuning{Queues: 4, Depth: 64, MaxIOBytes: 1 << 20, UserCopy: true, PoolBytes: 16 << 20, BufferBytes: 20 << 20}, false},
		{"zero copy wins over user copy", TuningInput{CPUs: 2, ZeroCopy: true, UserCopy: true},
			Tuning{Queues: 2, Depth: 64, MaxIOBytes: 1 << 20, ZeroCopy: true}, false},
		{"user copy max i/o override", TuningInput{CPUs: 2, UserCopy: true, MaxIOBytes: 256 << 10},
			Tuning{Queues: 2, Depth: 64, MaxIOBytes: 256 << 10, UserCopy: true, PoolBytes: 16 << 20, BufferBytes: 18 << 20}, false},
		{"three queues user copy: whole chunks per queue", TuningInput{CPUs: 4, Queues: 3, UserCopy: true},
			Tuning{Queues: 3, Depth: 64, MaxIOBytes: 1 << 20, UserCopy: true, PoolBytes: 3 * 5456 << 10, BufferBytes: 3*5456<<10 + 3<<20}, false},
		{"user copy requests within a tag's buffer need no pool", TuningInput{CPUs: 2, UserCopy: true, MaxIOBytes: 8 << 10},
			Tuning{Queues: 2, Depth: 64, MaxIOBytes: 8 << 10, UserCopy: true, BufferBytes: 1 << 20}, false},
		{"user copy small budget keeps one request per queue", TuningInput{CPUs: 2, UserCopy: true, MemoryBudget: 2 << 20},
			Tuning{Queues: 2, Depth: 64, MaxIOBytes: 1 << 20, UserCopy: true, PoolBytes: 2 << 20, BufferBytes: 4 << 20}, false},
		{"user copy overrides above hard cap", TuningInput{CPUs: 8, Queues: 4, Depth: 4096, UserCopy: true}, Tuning{}, true},
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
