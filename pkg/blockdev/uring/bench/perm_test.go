package bench

import "testing"

// TestBlockPermVisitsEachBlockOncePerPass proves the random map property:
// every block exactly once per pass, for sizes on and off a power of four,
// and a different order in the next pass.
func TestBlockPermVisitsEachBlockOncePerPass(t *testing.T) {
	for _, n := range []uint64{1, 2, 3, 16, 1000, 4096, 262145} {
		p := newBlockPerm(n, n*7+1)
		var first []uint64
		for pass := range 2 {
			seen := make([]bool, n)
			var order []uint64
			for range n {
				b := p.next()
				if b >= n || seen[b] {
					t.Fatalf("n=%d pass %d: block %d out of range or repeated", n, pass, b)
				}
				seen[b] = true
				order = append(order, b)
			}
			if pass == 0 {
				first = order
			} else if n >= 16 && equal(first, order) {
				t.Errorf("n=%d: the second pass repeats the first pass's order", n)
			}
		}
	}
}

func equal(a, b []uint64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// TestBlockPermLooksRandom: consecutive blocks are not a stride, and the
// first half of a pass covers both halves of the range about evenly.
func TestBlockPermLooksRandom(t *testing.T) {
	const n = 1 << 16
	p := newBlockPerm(n, 42)
	low, strides := 0, 0
	prev := p.next()
	for range n/2 - 1 {
		b := p.next()
		if b < n/2 {
			low++
		}
		if b == prev+1 {
			strides++
		}
		prev = b
	}
	if low < n/4-n/32 || low > n/4+n/32 {
		t.Errorf("%d of the first half-pass's blocks in the lower half, want about %d", low, n/4)
	}
	if strides > n/256 {
		t.Errorf("%d sequential neighbours in a half pass, want few", strides)
	}
}
