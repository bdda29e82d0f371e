package copypace

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
)

// DefaultBudget is the share of a volume's IOPS the node's copies may cost
// it.
const DefaultBudget = 0.2

// Config says what a Governor watches and how much copies may cost.
type Config struct {
	// Devices lists the block devices (paths) of the node's volumes
	// that are attached: the volumes copies must leave their I/O to.
	Devices func(context.Context) ([]string, error)
	// Budget is the share of a volume's IOPS copies may cost it,
	// DefaultBudget when 0; a negative Budget paces nothing but the
	// copies' own rates.
	Budget float64
}

// Governor paces a node's copies (see the package comment). It is safe
// for concurrent use; its control loop runs only while a copy is paced.
type Governor struct {
	cfg    Config
	timing timing

	mu      sync.Mutex
	copies  int           // Pacers not closed
	running bool          // the control loop runs
	paused  chan struct{} // non-nil during a pause; closed when it ends
	allow   float64       // bytes per second for all copies; +Inf: no bound
	perByte costRate      // what they cost per byte per second
	known   bool          // perByte is measured
	last    Status

	moved atomic.Int64 // bytes all copies moved
}

// Status is what a Governor did last, for the node's status.
type Status struct {
	// Copies is the number of copies paced.
	Copies int `json:"copies"`
	// Bounded says the copies are held to AllowedBytesPerSecond, all
	// of them together, because a volume is in use (each copy still
	// moves at least its floor: 0 holds each to its floor); otherwise
	// they are bounded by their own rates alone.
	Bounded               bool    `json:"bounded"`
	AllowedBytesPerSecond float64 `json:"allowedBytesPerSecond,omitempty"`
	// Cost is what the copies cost the worst-hit device while they ran
	// in the last cycle that measured one (a share of its IOPS).
	Cost float64 `json:"cost,omitempty"`
	// Device is that device.
	Device string `json:"device,omitempty"`
	// Pauses counts the pauses of the copies to measure the devices
	// without them.
	Pauses uint64 `json:"pauses"`
}

// New returns a Governor for cfg.
func New(cfg Config) *Governor {
	if cfg.Budget == 0 {
		cfg.Budget = DefaultBudget
	}
	return &Governor{cfg: cfg, timing: defaultTiming, allow: math.Inf(1)}
}

// Off reports whether the Governor paces copies by their rates alone
// (a negative Budget).
func (g *Governor) Off() bool { return g.cfg.Budget < 0 }

// Status reports the Governor's state.
func (g *Governor) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.last
	s.Copies = g.copies
	if !math.IsInf(g.allow, 1) {
		s.Bounded, s.AllowedBytesPerSecond = true, g.allow
	}
	return s
}

// Pacer registers a copy limited to rate bytes per second (0: no limit);
// the copy calls Close when it ends.
func (g *Governor) Pacer(rate int64) *Pacer {
	r := math.Inf(1)
	if rate > 0 {
		r = float64(rate)
	}
	p := &Pacer{g: g, rate: r, floor: floorRate(rate)}
	if g.cfg.Budget < 0 {
		return p
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.copies++
	p.registered = true
	if !g.running {
		g.running = true
		go g.loop()
	}
	return p
}

func (g *Governor) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.copies--
}

// share is what one copy may move while a volume is in use: the
// allowance split evenly between the copies.
func (g *Governor) share() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.allow / float64(max(g.copies, 1))
}

// waitPause returns when no pause is on (or ctx ends).
func (g *Governor) waitPause(ctx context.Context) error {
	g.mu.Lock()
	ch := g.paused
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *Governor) setPaused(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case on && g.paused == nil:
		g.paused = make(chan struct{})
	case !on && g.paused != nil:
		close(g.paused)
		g.paused = nil
	}
}

// loop is the control loop; it runs while copies are registered. While a
// volume is in use each cycle pauses the copies to measure the devices
// without them, lets them run for timing.run and compares; otherwise it
// only watches the devices, every timing.watch, without pausing. The first cycle
// measures before the copies start, and starts them at their floors if a
// volume is in use, so that a short copy does not run unpaced beside it.
func (g *Governor) loop() {
	defer g.setPaused(false)
	busy, first := true, true
	for {
		devs := g.devices()
		var rests map[string]window
		if busy {
			rests = g.pause(devs)
			if first && anyBusy(rests) {
				g.setAllowance(0)
			}
		}
		first = false
		run := g.timing.watch
		if busy {
			run = g.timing.run
		}
		a, m0, t0 := readAll(devs), g.moved.Load(), time.Now()
		time.Sleep(run)
		b, m1, t1 := readAll(devs), g.moved.Load(), time.Now()
		if !g.stay() {
			return
		}
		runs := windows(a, b, t1.Sub(t0).Seconds())
		if anyBusy(rests) {
			g.measured(runs, rests, float64(m1-m0)/t1.Sub(t0).Seconds())
		}
		busy = anyBusy(runs) || anyBusy(rests)
		if !busy {
			g.idle()
		}
	}
}

// pause holds the copies for timing.pause and returns the devices' I/O
// meanwhile, after the first settle.
func (g *Governor) pause(devs []string) map[string]window {
	g.setPaused(true)
	defer g.setPaused(false)
	g.mu.Lock()
	g.last.Pauses++
	g.mu.Unlock()
	time.Sleep(g.timing.settle)
	c, t0 := readAll(devs), time.Now()
	time.Sleep(g.timing.pause - g.timing.settle)
	d, t1 := readAll(devs), time.Now()
	return windows(c, d, t1.Sub(t0).Seconds())
}

// stay reports whether the loop goes on: false, and the loop is marked
// stopped, once no copy is registered.
func (g *Governor) stay() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.copies > 0 {
		return true
	}
	g.running = false
	g.allow, g.known = math.Inf(1), false
	return false
}

// idle lifts the allowance while no volume is in use, and forgets what
// the copies cost: what they cost beside the next volume is its own.
func (g *Governor) idle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allow, g.known = math.Inf(1), false
}

func (g *Governor) setAllowance(a float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allow = a
}

// measured sets the allowance from a cycle's windows: the devices' I/O
// while copies ran (runs) and paused (rests), and the bytes per second
// the copies moved meanwhile.
func (g *Governor) measured(runs, rests map[string]window, moved float64) {
	worst, dev, ok := 0.0, "", false
	var wrun, wrest window
	for path, rest := range rests {
		run, found := runs[path]
		if !found {
			continue
		}
		if c, measured := deviceCost(run, rest); measured && (!ok || c > worst) {
			worst, dev, ok, wrun, wrest = c, path, true, run, rest
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !ok {
		return
	}
	g.last.Cost, g.last.Device = worst, dev
	if moved < minFloor {
		return // the copies hardly moved: the cost is not theirs to judge
	}
	before := g.allow
	g.perByte, g.known = g.perByte.next(worst, moved, !g.known), true
	g.allow = nextAllowance(g.allow, moved, g.perByte, g.cfg.Budget)
	klog.V(4).InfoS("copy pacing", "device", dev, "cost", worst, "moved", int64(moved), "allowBefore", before, "allow", g.allow,
		"costPerMiBps", float64(g.perByte)*(1<<20),
		"runIOPS", int64(wrun.ios/wrun.secs), "restIOPS", int64(wrest.ios/wrest.secs),
		"runLatencyMs", wrun.ticks/max(wrun.ios, 1), "restLatencyMs", wrest.ticks/max(wrest.ios, 1))
}

func (g *Governor) devices() []string {
	ctx, cancel := context.WithTimeout(context.Background(), g.timing.run)
	defer cancel()
	devs, err := g.cfg.Devices(ctx)
	if err != nil {
		klog.V(2).InfoS("copy pacing: no device list", "err", err)
	}
	return devs
}

// readAll reads the counters of devs; devices that cannot be read (gone)
// are left out.
func readAll(devs []string) map[string]blkdev.Stats {
	out := make(map[string]blkdev.Stats, len(devs))
	for _, d := range devs {
		if s, err := blkdev.ReadStats(d); err == nil {
			out[d] = s
		}
	}
	return out
}

// windows is each device's I/O from a to b, secs apart.
func windows(a, b map[string]blkdev.Stats, secs float64) map[string]window {
	out := make(map[string]window, len(b))
	for d, sb := range b {
		if sa, ok := a[d]; ok {
			out[d] = between(sa, sb, secs)
		}
	}
	return out
}

// anyBusy reports whether a device did enough I/O to be measured.
func anyBusy(ws map[string]window) bool {
	for _, w := range ws {
		if w.ios >= minIOs {
			return true
		}
	}
	return false
}
