package bench

import (
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram in nanoseconds: values below 64
// are exact; above, each power of two is split into 32 buckets (≤ 3%
// error). Recording allocates nothing.
type hist struct {
	counts [64 * 32]uint64
	n      uint64
}

const subBits = 5

func bucketOf(ns uint64) int {
	if ns < 64 {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // ≥ 6
	sub := (ns >> (e - subBits)) & (1<<subBits - 1)
	return 64 + (e-6)*(1<<subBits) + int(sub)
}

// lowerBound returns the smallest value of bucket b.
func lowerBound(b int) uint64 {
	if b < 64 {
		return uint64(b)
	}
	e := (b-64)/(1<<subBits) + 6
	sub := uint64((b - 64) % (1 << subBits))
	return 1<<e | sub<<(e-subBits)
}

func (h *hist) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	b := bucketOf(uint64(d))
	if b >= len(h.counts) {
		b = len(h.counts) - 1
	}
	h.counts[b]++
	h.n++
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// percentile returns the value at quantile q (0..1), as the midpoint of
// the bucket it falls in.
func (h *hist) percentile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = max(1, min(rank, h.n))
	var seen uint64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowerBound(b), lowerBound(b+1)
			return time.Duration((lo + hi) / 2)
		}
	}
	return 0
}
