package ublk

import (
	"runtime"
	"testing"
)

// TestProcBudget proves the GOMAXPROCS policy on the real runtime: one
// more P per running queue thread, at most twice the base, back to the
// base when the threads end, and untouched when the operator set it.
func TestProcBudget(t *testing.T) {
	start := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(start)
	b := procBudget{}
	steps := []struct{ add, want int }{
		{1, start + 1},
		{1, start + 2},
		{2 * start, 3 * start}, // capped at twice the base
		{-2 * start, start + 2},
		{-2, start},
		{-1, start}, // never below the base
	}
	for i, s := range steps {
		b.add(s.add)
		if got := runtime.GOMAXPROCS(0); got != s.want {
			t.Fatalf("step %d (add %d): GOMAXPROCS %d, want %d", i, s.add, got, s.want)
		}
	}

	fixed := procBudget{fixed: true}
	fixed.add(4)
	if got := runtime.GOMAXPROCS(0); got != start {
		t.Errorf("fixed budget changed GOMAXPROCS to %d, want %d", got, start)
	}
}
