package dataplane

import (
	"math"
	"sync/atomic"
	"time"
)

// Rate limits. With a Limiter (QueueConfig.Limiter), each read and write
// books its start on arrival (qos.Limiter.Book, shared with the device's
// other queues). A request due at once goes to the backing file in the same
// round; a later one is held here, in booking order, and issued by the
// first round that finds it due. Holding costs nothing but the tag: the
// thread's sleeping wait is bounded by the first held request's start, and
// the kernel sees the request in flight, as it would on a slower disk.
// Flushes, discards and zeroing are not paced.

// Pausing (Gate). A device whose gate is closed holds every request that
// arrives, of any kind, in the same ring as the rate limits, booked for
// pausedDue; once no backing operation of the device is in flight, its
// backing file holds every write acknowledged before and none after, so it
// can be copied or cloned consistently. Opening the gate books the held
// requests again (under the rate limits, if any) and they go on in order.

// Gate pauses the queues of a device; its zero value is open.
type Gate struct {
	closed atomic.Bool
	// settled: closed, and no backing operation of the device was in
	// flight since (MarkSettled).
	settled atomic.Bool
	gen     atomic.Uint64 // bumped when the gate opens
}

// Close makes the device's queues hold every request that arrives.
func (g *Gate) Close() { g.closed.Store(true) }

// Closed reports whether the gate holds the device's requests.
func (g *Gate) Closed() bool { return g.closed.Load() }

// MarkSettled records that, the gate closed, none of the device's backing
// operations is in flight any more (the pauser waited for them): until
// the gate opens, the backing file holds every write and gets no other.
func (g *Gate) MarkSettled() { g.settled.Store(g.closed.Load()) }

// Held reports whether the device's I/O is held: the gate closed and
// settled since (MarkSettled).
func (g *Gate) Held() bool { return g.closed.Load() && g.settled.Load() }

// Open lets the held requests go (the caller wakes the threads).
func (g *Gate) Open() {
	g.settled.Store(false)
	g.closed.Store(false)
	g.gen.Add(1)
}

// pausedDue is the start booked for requests held by a closed gate.
const pausedDue = math.MaxInt64

func (l *queueState) gateClosed() bool { return l.cfg.Gate != nil && l.cfg.Gate.closed.Load() }

// gen is the generation of what the held requests were booked under: the
// rate limits' and the gate's.
func (l *queueState) gen() uint64 {
	var g uint64
	if l.cfg.Limiter != nil {
		g = l.cfg.Limiter.Gen()
	}
	if l.cfg.Gate != nil {
		g += l.cfg.Gate.gen.Load() << 32
	}
	return g
}

// book returns the start of a request of n bytes arriving at now: held
// while the gate is closed, paced by the limits, or at once.
func (l *queueState) book(t *tagState, now int64) int64 {
	switch {
	case l.gateClosed():
		return pausedDue
	case l.cfg.Limiter != nil && (t.plan.act == actRead || t.plan.act == actWrite):
		return l.cfg.Limiter.Book(now, t.req.len)
	}
	return now
}

// throttle books the request just arrived on tag at now and holds it when
// it may not start yet, or when others are held before it. It reports
// whether it held the request.
func (l *queueState) throttle(tag uint16, now int64) bool {
	t := &l.tags[tag]
	if l.held == nil {
		return false
	}
	if !l.gateClosed() && (l.cfg.Limiter == nil || (t.plan.act != actRead && t.plan.act != actWrite)) {
		return false // only reads and writes are paced
	}
	if l.heldLen == 0 {
		// Whatever is held from here on is booked under the limits in
		// force now; read before booking, so a change in between only
		// makes release book once more, never skips a rebooking.
		l.limGen = l.gen()
	}
	t.due = l.book(t, now)
	if t.due <= now && l.heldLen == 0 {
		return false
	}
	l.held[(l.heldHead+l.heldLen)%len(l.held)] = tag
	l.heldLen++
	if !l.inHeld {
		l.inHeld = true
		l.s.held = append(l.s.held, l)
	}
	l.q.stats.throttled.Add(1)
	return true
}

// release issues the held requests due at now, in booking order. When the
// limits changed since they were booked it books them again first, so that
// a raised limit frees them at once.
func (l *queueState) release(now int64) error {
	if l.gateClosed() {
		return nil
	}
	if g := l.gen(); g != l.limGen {
		l.limGen = g
		for i := range l.heldLen {
			t := &l.tags[l.held[(l.heldHead+i)%len(l.held)]]
			t.due = l.book(t, now)
		}
	}
	for l.heldLen > 0 {
		tag := l.held[l.heldHead]
		t := &l.tags[tag]
		if t.due > now {
			break
		}
		l.heldHead = (l.heldHead + 1) % len(l.held)
		l.heldLen--
		l.q.stats.throttledNs.Add(uint64(now - t.start))
		if err := l.start(tag); err != nil {
			return err
		}
	}
	return nil
}

// heldWait bounds a sleeping wait at now so that the thread wakes when the
// first held request falls due; 0 means none is held.
func (l *queueState) heldWait(now int64) time.Duration {
	if l.heldLen == 0 || l.tags[l.held[l.heldHead]].due == pausedDue {
		return 0 // none, or held until the gate opens (which wakes the thread)
	}
	return max(time.Duration(l.tags[l.held[l.heldHead]].due-now), time.Microsecond)
}
