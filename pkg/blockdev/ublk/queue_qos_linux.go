package ublk

import "time"

// Rate limits. With a Limiter (QueueConfig.Limiter), each read and write
// books its start on arrival (qos.Limiter.Book, shared with the device's
// other queues). A request due at once goes to the backing file in the same
// round; a later one is held here, in booking order, and issued by the
// first round that finds it due. Holding costs nothing but the tag: the
// thread's sleeping wait is bounded by the first held request's start, and
// the kernel sees the request in flight, as it would on a slower disk.
// Flushes, discards and zeroing are not paced.

// throttle books the request just arrived on tag at now and holds it when
// it may not start yet, or when others are held before it. It reports
// whether it held the request.
func (l *loop) throttle(tag uint16, now int64) bool {
	t := &l.tags[tag]
	if l.cfg.Limiter == nil || (t.plan.act != actRead && t.plan.act != actWrite) {
		return false
	}
	if l.heldLen == 0 {
		// Whatever is held from here on is booked under the limits in
		// force now; read before booking, so a change in between only
		// makes release book once more, never skips a rebooking.
		l.limGen = l.cfg.Limiter.Gen()
	}
	t.due = l.cfg.Limiter.Book(now, t.req.len)
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
func (l *loop) release(now int64) error {
	if g := l.cfg.Limiter.Gen(); g != l.limGen {
		l.limGen = g
		for i := range l.heldLen {
			t := &l.tags[l.held[(l.heldHead+i)%len(l.held)]]
			t.due = l.cfg.Limiter.Book(now, t.req.len)
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
		if err := l.issue(tag); err != nil {
			return err
		}
	}
	return nil
}

// heldWait bounds a sleeping wait at now so that the thread wakes when the
// first held request falls due; 0 means none is held.
func (l *loop) heldWait(now int64) time.Duration {
	if l.heldLen == 0 {
		return 0
	}
	return max(time.Duration(l.tags[l.held[l.heldHead]].due-now), time.Microsecond)
}
