package copypace

import (
	"math"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
)

// TestDeviceCost: what copies cost a device is the larger of the IOPS it
// lost and the IOPS a full queue loses to its longer latency; a pause with
// too little I/O measures nothing.
func TestDeviceCost(t *testing.T) {
	for _, tc := range []struct {
		name      string
		run, rest window
		want      float64
		ok        bool
	}{
		{"no cost", window{1000, 1000, 1}, window{500, 500, 0.5}, 0, true},
		{"half the IOPS, same latency", window{500, 500, 1}, window{1000, 1000, 1}, 0.5, true},
		{"same IOPS, latency doubled (fixed-rate workload)", window{1000, 2000, 1}, window{1000, 1000, 1}, 0.5, true},
		{"IOPS and latency both", window{800, 1600, 1}, window{1000, 1000, 1}, 0.5, true},
		{"more IOPS while copying: no cost", window{1200, 1000, 1}, window{1000, 1000, 1}, 0, true},
		{"stalled while copying", window{0, 0, 1}, window{1000, 1000, 1}, 1, true},
		{"too little I/O in the pause", window{1000, 1000, 1}, window{minIOs - 1, 10, 1}, 0, false},
		{"ticks below a millisecond", window{100, 0, 1}, window{200, 0, 1}, 0.5, true},
	} {
		got, ok := deviceCost(tc.run, tc.rest)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: deviceCost = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestBetween: a window counts reads and writes and their ticks, not
// discards or flushes.
func TestBetween(t *testing.T) {
	a := blkdev.Stats{ReadIOs: 10, WriteIOs: 5, ReadTicksMs: 7, WriteTicksMs: 3, DiscardIOs: 1, FlushIOs: 4}
	b := blkdev.Stats{ReadIOs: 110, WriteIOs: 55, ReadTicksMs: 107, WriteTicksMs: 53, DiscardIOs: 9, FlushIOs: 40}
	if w := between(a, b, 2); w != (window{ios: 150, ticks: 150, secs: 2}) {
		t.Errorf("between = %+v", w)
	}
}

// TestCostRate: the estimate of what copies cost per byte per second
// starts at the first measurement and then follows each by smooth.
func TestCostRate(t *testing.T) {
	const mib = 1 << 20
	e := costRate(0).next(0.2, 20*mib, true)
	if want := costRate(0.01 / mib); math.Abs(float64(e-want)) > 1e-15 {
		t.Fatalf("first estimate %g, want %g", e, want)
	}
	e = e.next(0, 40*mib, false)
	if want := costRate(0.007 / mib); math.Abs(float64(e-want)) > 1e-15 {
		t.Errorf("after a cycle that cost nothing: %g, want %g", e, want)
	}
}

// TestNextAllowance: the allowance is what keeps the cost at its aim by
// the estimate, at most halved or doubled in a cycle once bounded, never
// raised beyond what the copies used, and set at once beside unbounded
// copies.
func TestNextAllowance(t *testing.T) {
	inf := math.Inf(1)
	const mib = 1 << 20
	target := DefaultBudget * aim
	per := func(cost, rate float64) costRate { return costRate(cost / rate) }
	for _, tc := range []struct {
		name         string
		allow, moved float64
		e            costRate
		want         float64
	}{
		{"unbounded copies: what keeps the aim", inf, 100 * mib, per(2*target, 100*mib), 50 * mib},
		{"unbounded, cheap: stays unbounded", inf, 100 * mib, 0, inf},
		{"bounded, at the aim: stays", 40 * mib, 40 * mib, per(target, 40*mib), 40 * mib},
		{"bounded, twice the aim: halves", 40 * mib, 40 * mib, per(2*target, 40*mib), 20 * mib},
		{"bounded, far above: at most halved", 40 * mib, 40 * mib, per(1, 40*mib), 20 * mib},
		{"bounded, cheap: at most doubled", 40 * mib, 40 * mib, per(target/8, 40*mib), 80 * mib},
		{"at the floors, cheap: double what moved", 0, 20 * mib, 0, 40 * mib},
		{"cheap, but the copies did not use it: stays", 40 * mib, 10 * mib, 0, 40 * mib},
	} {
		if got := nextAllowance(tc.allow, tc.moved, tc.e, DefaultBudget); math.Abs(got-tc.want) > 1 && got != tc.want {
			t.Errorf("%s: nextAllowance = %.0f, want %.0f", tc.name, got, tc.want)
		}
	}
}

// TestFloorRate: a tenth of a copy's rate (of the default rate without
// one), never below the peer channel's least rate nor above the rate.
func TestFloorRate(t *testing.T) {
	for _, tc := range []struct {
		rate int64
		want float64
	}{
		{0, 20 << 20},
		{200 << 20, 20 << 20},
		{50 << 20, 5 << 20},
		{4 << 20, 1 << 20},
		{512 << 10, 512 << 10},
	} {
		if got := floorRate(tc.rate); got != tc.want {
			t.Errorf("floorRate(%d) = %.0f, want %.0f", tc.rate, got, tc.want)
		}
	}
}
