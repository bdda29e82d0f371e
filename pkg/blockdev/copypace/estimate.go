package copypace

import (
	"math"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
)

// minIOs is the fewest I/Os a device must complete in a pause for its cost
// to be measured: fewer say too little about its rate or latency, and a
// device that idle has little to lose.
const minIOs = 20

// window is one device's I/O over an interval: I/Os completed and the
// milliseconds they took, summed (the kernel's read and write ticks).
type window struct {
	ios, ticks float64
	secs       float64
}

// between is the I/O of a device from a to b, taken secs apart.
func between(a, b blkdev.Stats, secs float64) window {
	return window{
		ios:   float64(b.ReadIOs+b.WriteIOs) - float64(a.ReadIOs+a.WriteIOs),
		ticks: float64(b.ReadTicksMs+b.WriteTicksMs) - float64(a.ReadTicksMs+a.WriteTicksMs),
		secs:  secs,
	}
}

// deviceCost is what copies cost a device, from its I/O while they ran
// (run) and while they paused (rest): the share of its IOPS it lost, or of
// the IOPS a workload at its queue depth loses to the longer latency (the
// same for a workload that keeps its queue full; only the second shows for
// one that issues at a fixed rate). ok is false when the pause did not
// have enough I/O to tell.
func deviceCost(run, rest window) (cost float64, ok bool) {
	if rest.ios < minIOs || rest.secs <= 0 || run.secs <= 0 || run.ios < 0 || rest.ios < 0 {
		return 0, false
	}
	if run.ios == 0 {
		return 1, true // it did no I/O at all while the copies ran
	}
	lost := 1 - (run.ios/run.secs)/(rest.ios/rest.secs)
	if run.ticks > 0 && rest.ticks > 0 {
		slower := 1 - (rest.ticks/rest.ios)/(run.ticks/run.ios)
		lost = max(lost, slower)
	}
	return min(max(lost, 0), 1), true
}

// Control of the allowance: the bytes per second all copies together may
// move while a volume is in use.
const (
	// aim is the share of the budget the control aims at: the rest is
	// room for the noise of its measurements.
	aim = 0.75
	// smooth is the weight of a new measurement in the estimate of
	// what the copies cost per byte: a single cycle's cost is noisy
	// (a fifth of a second of a device's I/O, beside whatever else the
	// node does), so the estimate follows several.
	smooth = 0.3
	// maxDown and maxUp bound one step of the allowance.
	maxDown, maxUp = 0.5, 2
)

// costRate is what copies cost per byte per second they move: a cost
// (a share of a device's IOPS) over bytes per second. Their CPU and disk
// time go with the bytes they move, so the cost grows in proportion.
type costRate float64

// next folds a cycle's cost, while the copies moved moved bytes per
// second, into the estimate e (none yet when first).
func (e costRate) next(cost, moved float64, first bool) costRate {
	k := costRate(cost / moved)
	if first {
		return k
	}
	return costRate(smooth)*k + costRate(1-smooth)*e
}

// nextAllowance returns the allowance for the next cycle from the
// estimate e of what the copies cost per byte per second: what keeps the
// cost at the aim, at most halving or doubling the allowance allow (0:
// each copy at its floor; math.Inf(1): none) in one cycle. The copies
// moved moved bytes per second under allow: an allowance they did not use
// (a copy held back by something else) is not raised.
func nextAllowance(allow, moved float64, e costRate, budget float64) float64 {
	want := math.Inf(1)
	if e > 0 {
		want = budget * aim / float64(e)
	}
	if math.IsInf(allow, 1) {
		return want // a volume in use appeared beside unbounded copies
	}
	up := max(allow, moved) * maxUp
	if moved < allow/2 {
		up = allow
	}
	return min(max(want, allow*maxDown), up)
}

// floorRate is the least a copy with the rate limit rate (0: none) moves
// however much it costs, so that no copy is held back for ever: minShare of
// its rate, or of defaultRate for a copy without one, and never below
// minFloor or above the rate itself.
func floorRate(rate int64) float64 {
	r := float64(rate)
	if rate <= 0 {
		r = defaultRate
	}
	return min(max(r*minShare, minFloor), r)
}

const (
	// minShare is the share of its rate a copy always gets.
	minShare = 0.1
	// defaultRate is the rate floorRate takes for a copy without one:
	// the plugin's default transfer rate.
	defaultRate = 200 << 20
	// minFloor is the least floor: the slowest a peer's stream may be
	// sent before it runs out of time (the peer channel's least rate).
	minFloor = 1 << 20
)

// timing is when the control loop measures.
type timing struct {
	// run is how long copies run between pauses while a volume is in
	// use; watch how often the loop looks at the devices otherwise.
	run, watch time.Duration
	// pause is how long they pause to measure the devices without
	// them; the first settle of it is not measured, while the copies'
	// last writes and the work they queued drain.
	pause, settle time.Duration
}

var defaultTiming = timing{run: 1500 * time.Millisecond, watch: 500 * time.Millisecond, pause: 250 * time.Millisecond, settle: 50 * time.Millisecond}
