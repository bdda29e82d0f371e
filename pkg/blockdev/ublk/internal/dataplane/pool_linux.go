package dataplane

import (
	"errors"
	"fmt"
	"sync"
)

// Threads is a server's fixed set of server threads, one per CPU it may
// use: every device's queues are spread over them (SpreadQueues), so the
// number of threads does not grow with the number of devices.
type Threads struct {
	mu      sync.Mutex // serialises pick, so two devices see each other's load
	threads []*Thread
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
func (p *Threads) Len() int { return len(p.threads) }

// pick chooses the threads for a device's queues (SpreadQueues) and
// reserves room for each queue on its thread before it returns, so that a
// concurrent pick sees the load (the caller's queues own the reservations:
// StartQueue with QueueConfig.Reserved).
func (p *Threads) Pick(queues int, depth uint16) ([]*Thread, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	loads := make([]int, len(p.threads))
	for i, t := range p.threads {
		if t.Err() != nil {
			loads[i] = -1 // failed: never chosen
			continue
		}
		loads[i] = t.load()
	}
	idx, err := SpreadQueues(loads, queues, QueueCost(depth), p.threads[0].cfg.Tags)
	if err != nil {
		return nil, err
	}
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

// Threads returns the threads.
func (p *Threads) Threads() []*Thread { return p.threads }

// Stats returns every thread's counters.
func (p *Threads) Stats() []ThreadStats {
	out := make([]ThreadStats, len(p.threads))
	for i, t := range p.threads {
		out[i] = t.Stats()
	}
	return out
}

// Err returns the failure of the first failed thread, or nil.
func (p *Threads) Err() error {
	for _, t := range p.threads {
		if err := t.Err(); err != nil {
			return err
		}
	}
	return nil
}

// live counts the threads that have not ended.
func (p *Threads) Live() int {
	n := 0
	for _, t := range p.threads {
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
	for _, t := range p.threads {
		t.stop()
	}
	var errs []error
	for _, t := range p.threads {
		errs = append(errs, t.Close())
	}
	return errors.Join(errs...)
}
