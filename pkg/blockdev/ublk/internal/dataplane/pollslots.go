package dataplane

import "sync/atomic"

// PollSlots bounds how many server threads of a pool poll for completions
// at once. A thread polls after a busy round when it has few requests in
// service (threadLoop.next): with a thread per device, every quiet device's
// thread would, and fifteen of them polling take the CPUs from the busy
// devices' threads and their clients. With a slot free a thread polls; with
// none it sleeps at once, as it would without polling. A nil *PollSlots
// bounds nothing.
type PollSlots struct {
	max  int32
	busy atomic.Int32
}

// NewPollSlots lets max threads poll at once (at least one).
func NewPollSlots(n int) *PollSlots { return &PollSlots{max: int32(max(1, n))} }

// take claims a slot, or reports that none is free.
func (p *PollSlots) take() bool {
	if p == nil {
		return true
	}
	if p.busy.Add(1) <= p.max {
		return true
	}
	p.busy.Add(-1)
	return false
}

// give returns a slot take claimed.
func (p *PollSlots) give() {
	if p != nil {
		p.busy.Add(-1)
	}
}
