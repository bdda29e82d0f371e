package dataplane

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Threads is a server's set of server threads. A shared pool
// (NewThreads) is fixed, one thread per CPU the server may use: every
// device's queues are spread over them (SpreadQueues), so the number of
// threads does not grow with the number of devices. A per-device pool
// (NewDeviceThreads) gives each device a thread of its own, up to a bound,
// as the kernel's loop driver gives each device its worker. A thread that
// failed keeps its place until Replace starts another in it.
type Threads struct {
	// mu serialises Pick, so two devices see each other's load, and
	// guards threads (Replace swaps one, a per-device pool grows) and
	// closed.
	mu      sync.Mutex
	threads []*Thread
	closed  bool // Close began: Replace starts no thread
	// max is a per-device pool's bound (0: a shared pool), cfg the
	// configuration of the threads it starts.
	max int
	cfg ThreadConfig
	// watch is called, in a goroutine of its own, with every thread the
	// pool has or starts later (Watch).
	watch func(*Thread)
	// room says whether a per-device pool may start another thread
	// (LimitGrowth; nil: up to max).
	room func() bool
}

// LimitGrowth makes a per-device pool ask room before it starts a thread
// beside its existing ones: while room says no, new devices share the
// least loaded thread. The pool's first thread needs no room.
func (p *Threads) LimitGrowth(room func() bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.room = room
}

// Watch calls fn, each time in a goroutine of its own, with every thread
// of the pool, the ones a per-device pool starts later included (a thread
// that Replace starts is its caller's to watch).
func (p *Threads) Watch(fn func(*Thread)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watch = fn
	for _, t := range p.threads {
		go fn(t)
	}
}

// NewThreads starts n server threads of cfg. It chooses each thread's CPU
// (cfg.CPU is not used: one CPU for every thread of a pool is never
// meant): with cfg.Pin, thread i is pinned to the i-th CPU the process may
// use (round robin); without, no thread moves.
func NewThreads(n int, cfg ThreadConfig) (*Threads, error) {
	if n <= 0 {
		return nil, fmt.Errorf("server threads: %d: %w", n, errInvalid)
	}
	var cpus []int
	cfg.Pin = cfg.Pin || cfg.Near
	if cfg.Pin {
		cpus = AllowedCPUs()
	}
	p := &Threads{}
	for i := range n {
		tc := cfg
		tc.CPU = -1
		if len(cpus) > 0 {
			tc.CPU = cpus[i%len(cpus)]
		}
		t, err := NewThread(i, tc)
		if err != nil {
			return nil, errors.Join(err, p.Close())
		}
		p.threads = append(p.threads, t)
	}
	return p, nil
}

// NewDeviceThreads starts a per-device pool: each device's queues get a
// thread of their own (one whose devices all left, or a new one) until the
// pool holds max threads; then a device's queues share the least loaded
// thread. Every thread serves all the queues of its devices, so that the
// threads stay as many as the devices, not their queues. cfg.Tags sizes
// each thread (0: room for a few devices, perDeviceTags). The pool keeps a
// P of the Go runtime for each of its threads (reserveProcs), and lets at
// most half the CPUs' worth of them poll at once (PollSlots).
func NewDeviceThreads(max int, cfg ThreadConfig) (*Threads, error) {
	if max <= 0 || max > MaxDeviceThreads {
		return nil, fmt.Errorf("server threads: at most %d per device pool, not %d: %w", MaxDeviceThreads, max, errInvalid)
	}
	if cfg.Pin || cfg.Near {
		return nil, fmt.Errorf("server threads: a per-device pool floats: %w", errInvalid)
	}
	if cfg.Tags <= 0 {
		cfg.Tags = perDeviceTags
	}
	if cfg.IOWQWorkers == 0 {
		// The thread's io-wq serves one device: a stalled backing
		// file holds only that device's writes, so the cap need not
		// grow with the queues. First writes into holes all go
		// through it, and 32 workers did not serve them faster
		// (docs/benchmarks.md, issue 50).
		cfg.IOWQWorkers = PerDeviceIOWQWorkers
	}
	if cfg.Pollers == nil {
		// Half the CPUs at most poll, so that polling for a few
		// quiet devices never takes every CPU from the busy ones.
		cfg.Pollers = NewPollSlots(len(AllowedCPUs()) / 2)
	}
	cfg.CPU = -1
	return &Threads{max: max, cfg: cfg}, nil
}

const (
	// MaxDeviceThreads bounds a per-device pool: past it devices share.
	MaxDeviceThreads = 1024
	// PerDeviceIOWQWorkers caps the io-wq workers of each thread of a
	// per-device pool (ThreadConfig.IOWQWorkers 0).
	PerDeviceIOWQWorkers = 4
	// perDeviceTags sizes a per-device pool's threads: room for the
	// queues of a few devices at the automatic depth, once the pool is
	// full and devices share, in rings a fraction of a shared thread's.
	perDeviceTags = 1024
)

// CanStart reports whether a per-device pool may still start a thread
// for a new device (it is under its bound): then no live thread is not
// the end of serving, as it is for a shared pool.
func (p *Threads) CanStart() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max > 0 && !p.closed && len(p.threads) < p.max
}

// Len is the number of threads.
func (p *Threads) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.threads)
}

// list returns a copy of the threads.
func (p *Threads) list() []*Thread {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.threads)
}

// ErrPoolClosed is the class of a Replace after Close.
var ErrPoolClosed = errors.New("server threads closed")

// Replace starts a new thread in the place of dead, a thread of the pool
// that failed, with its number and configuration (its CPU), and returns
// it. The queues dead served are gone with it (they ended with its
// failure); the new thread starts empty, for the devices re-adopted after
// it. It fails while dead still runs, for a thread not in the pool, and
// after Close (ErrPoolClosed).
func (p *Threads) Replace(dead *Thread) (*Thread, error) {
	select {
	case <-dead.Done():
	default:
		return nil, fmt.Errorf("replace server thread %d: it still runs: %w", dead.id, errInvalid)
	}
	p.mu.Lock()
	i := slices.Index(p.threads, dead)
	closed := p.closed
	p.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("replace server thread %d: %w", dead.id, ErrPoolClosed)
	case i < 0:
		return nil, fmt.Errorf("replace server thread %d: not in the pool: %w", dead.id, errInvalid)
	}
	// Started outside the lock (it waits for the thread's ring): Pick
	// goes on meanwhile, passing over the dead thread.
	t, err := NewThread(dead.id, dead.cfg)
	if err != nil {
		return nil, fmt.Errorf("replace server thread %d: %w", dead.id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.threads[i] != dead {
		// Closed, or replaced by another caller, meanwhile.
		return nil, errors.Join(fmt.Errorf("replace server thread %d: %w", dead.id, ErrPoolClosed), t.Close())
	}
	p.threads[i] = t
	return t, nil
}

// Pick chooses the threads for a device's queues (SpreadQueues) and
// reserves room for each queue on its thread before it returns, so that a
// concurrent pick sees the load (the caller's queues own the reservations:
// StartQueue with QueueConfig.Reserved).
func (p *Threads) Pick(queues int, depth uint16) ([]*Thread, error) {
	return p.PickNear(make([][]int, queues), depth)
}

// Near reports whether the threads are pinned one per CPU to serve each
// queue near its CPUs (ThreadConfig.Near): then the caller reads each
// queue's CPUs from the kernel for PickNear.
func (p *Threads) Near() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max == 0 && p.threads[0].cfg.Near
}

// PickNear is Pick for queues the kernel maps to CPUs (near[q] for queue
// q, one entry per queue): each goes to a thread pinned to one of its
// CPUs where one has room (PlaceQueues).
func (p *Threads) PickNear(near [][]int, depth uint16) ([]*Thread, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > 0 {
		return p.pickDevice(len(near), depth)
	}
	loads := make([]int, len(p.threads))
	cpus := make([]int, len(p.threads))
	for i, t := range p.threads {
		cpus[i] = -1
		if t.cfg.Pin {
			cpus[i] = t.cfg.CPU
		}
		if t.Err() != nil {
			loads[i] = -1 // failed: never chosen
			continue
		}
		loads[i] = t.load()
	}
	idx, err := PlaceQueues(loads, cpus, near, QueueCost(depth), p.threads[0].cfg.Tags)
	if err != nil {
		return nil, err
	}
	queues := len(near)
	out := make([]*Thread, queues)
	for q, i := range idx {
		if err := p.threads[i].reserve(depth); err != nil {
			UnreserveAll(out[:q], depth)
			return nil, err
		}
		out[q] = p.threads[i]
	}
	return out, nil
}

// pickDevice chooses the thread of a per-device pool for all of a
// device's queues: an idle live thread, else a new one while the pool is
// under its bound, else the least loaded live thread with room.
func (p *Threads) pickDevice(queues int, depth uint16) ([]*Thread, error) {
	if p.closed {
		return nil, fmt.Errorf("pick server thread: %w", ErrPoolClosed)
	}
	need := queues * QueueCost(depth)
	var best *Thread
	for _, t := range p.threads {
		if t.Err() != nil {
			continue
		}
		l := t.load()
		if l+need > t.cfg.Tags {
			continue
		}
		if best == nil || l < best.load() {
			best = t
		}
	}
	if (best == nil || best.load() > 0) && len(p.threads) < p.max && (best == nil || p.room == nil || p.room()) {
		cfg := p.cfg
		cfg.Tags = max(cfg.Tags, need)
		t, err := NewThread(len(p.threads), cfg)
		switch {
		case err == nil:
			p.threads = append(p.threads, t)
			reserveProcs(len(p.threads))
			if p.watch != nil {
				go p.watch(t)
			}
			best = t
		case best == nil:
			return nil, err
		}
		// A thread that cannot start (the pids limit reached since the
		// room was read) leaves the device to share best.
	}
	if best == nil {
		return nil, fmt.Errorf("%d queues of depth %d: no server thread has room for %d more tags: %w",
			queues, depth, need, ErrThreadFull)
	}
	out := make([]*Thread, queues)
	for q := range out {
		if err := best.reserve(depth); err != nil {
			UnreserveAll(out[:q], depth)
			return nil, err
		}
		out[q] = best
	}
	return out, nil
}

// UnreserveAll gives back one queue's reservation on each of threads.
func UnreserveAll(threads []*Thread, depth uint16) {
	for _, t := range threads {
		t.unreserve(depth)
	}
}

// Threads returns the threads (a copy: Replace may swap one).
func (p *Threads) Threads() []*Thread { return p.list() }

// Stats returns every thread's counters.
func (p *Threads) Stats() []ThreadStats {
	ths := p.list()
	out := make([]ThreadStats, len(ths))
	for i, t := range ths {
		out[i] = t.Stats()
	}
	return out
}

// Err returns the failure of the first failed thread, or nil.
func (p *Threads) Err() error {
	for _, t := range p.list() {
		if err := t.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Live counts the threads that have not ended.
func (p *Threads) Live() int {
	n := 0
	for _, t := range p.list() {
		select {
		case <-t.Done():
		default:
			n++
		}
	}
	return n
}

// Close ends every thread (see Thread.Close) and returns their failures.
func (p *Threads) Close() error {
	p.mu.Lock()
	p.closed = true
	ths := slices.Clone(p.threads)
	p.mu.Unlock()
	for _, t := range ths {
		t.stop()
	}
	var errs []error
	for _, t := range ths {
		errs = append(errs, t.Close())
	}
	return errors.Join(errs...)
}
