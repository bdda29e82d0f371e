package dataplane

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Threads is a server's fixed set of server threads, one per CPU it may
// use: every device's queues are spread over them (SpreadQueues), so the
// number of threads does not grow with the number of devices. A thread
// that failed keeps its place until Replace starts another in it.
type Threads struct {
	// mu serialises Pick, so two devices see each other's load, and
	// guards threads (Replace swaps one) and closed.
	mu      sync.Mutex
	threads []*Thread
	closed  bool // Close began: Replace starts no thread
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
	return p.threads[0].cfg.Near
}

// PickNear is Pick for queues the kernel maps to CPUs (near[q] for queue
// q, one entry per queue): each goes to a thread pinned to one of its
// CPUs where one has room (PlaceQueues).
func (p *Threads) PickNear(near [][]int, depth uint16) ([]*Thread, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
