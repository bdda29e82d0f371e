package bench

import (
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 65, 100, 1000, 4095, 4096, 123456, 1 << 40} {
		b := bucketOf(v)
		if lo, hi := lowerBound(b), lowerBound(b+1); v < lo || v >= hi {
			t.Errorf("%d in bucket %d = [%d,%d)", v, b, lo, hi)
		}
	}
}

func TestPercentile(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	cases := []struct {
		name string
		q    float64
		want time.Duration
	}{
		{"p50", 0.50, 500 * time.Microsecond},
		{"p90", 0.90, 900 * time.Microsecond},
		{"p99", 0.99, 990 * time.Microsecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := h.percentile(c.q)
			if d := got - c.want; d > c.want/20 || -d > c.want/20 {
				t.Errorf("got %v, want %v ± 5%%", got, c.want)
			}
		})
	}
}
