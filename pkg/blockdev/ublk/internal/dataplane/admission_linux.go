package dataplane

import "slices"

// Admission to the backing disk. A server thread sends its reads and writes
// to the backing files with the kernel's non-blocking submission: when the
// disk under them has no request slot (tag) free, the kernel hands the
// operation to the thread's io-wq workers, which wait for one. Those
// workers are shared by every device the thread serves and take the
// hand-offs in arrival order, so beside busy neighbours a quiet volume's
// read can queue behind hundreds of their writes, in a FIFO the thread
// cannot reorder, and every hand-off costs a wake-up and two context
// switches. The
// kernel loop driver has no such queue: each loop device's worker blocks
// for a slot on its own, so a quiet loop device waits for at most one
// write per busy device.
//
// So the thread keeps at most admitCap reads and writes in flight (its
// share of the disk's slots, QueueConfig.DiskSlots) and holds the rest of
// its requests itself, in a queue per device queue. As reads and writes
// complete, admit issues the held ones: first those of light queues (a
// device at a low queue depth, as in the fair rounds), then one request
// per queue in turn, so that each busy device gets an equal share of the
// disk and a quiet one waits for at most one slot. Flushes and zeroing are
// not held: they take no slot for long, or none.
//
// It is off unless ThreadConfig.DiskSlots asks for it: in the VM (virtio
// disk of 256 slots per hardware queue, 15 busy volumes at depth 32 beside
// a quiet one) it changed neither the quiet volume's latency nor the
// neighbours' throughput beyond the noise, so the disk's slots were not
// where they waited there (docs/benchmark-studies.md).

// lightRequests is the most requests a queue may have in service (received
// and not yet committed: issued, held for a rate limit, or held for a disk
// slot) and still count as light: served first in a round (lightFirst) and
// admitted first to the disk (admit).
const lightRequests = 2

// light reports whether the queue is light: few requests in service.
func (l *queueState) light() bool { return l.tally.inFlight <= lightRequests }

// start issues tag's request to the backing file, or holds it for a disk
// slot when the thread's reads and writes fill its share of the disk or
// other requests already wait for one (they go first).
func (l *queueState) start(tag uint16) error {
	t := &l.tags[tag]
	s := l.s
	if s.admitCap <= 0 || (t.plan.act != actRead && t.plan.act != actWrite) {
		return l.issue(tag)
	}
	if s.admitted < s.admitCap && len(s.admitting) == 0 {
		t.admitted = true
		s.admitted++
		return l.issue(tag)
	}
	if l.waiting == nil {
		l.waiting = make([]uint16, len(l.tags))
	}
	l.waiting[(l.waitHead+l.waitLen)%len(l.waiting)] = tag
	l.waitLen++
	if !l.inAdmitting {
		l.inAdmitting = true
		s.admitting = append(s.admitting, l)
	}
	l.tally.diskWaits++
	// A held read or write counts as a backing operation for Pause
	// (Queue.Settled): it passed the gate and will reach the file.
	l.tally.backing++
	l.touched()
	return nil
}

// finishAdmitted gives tag's disk slot back when its request ends.
func (l *queueState) finishAdmitted(t *tagState) {
	if t.admitted {
		t.admitted = false
		l.s.admitted--
	}
}

// admit issues held requests while the thread's share of the disk has
// room: those of light queues first, then round robin over the others.
func (s *threadLoop) admit() {
	for s.admitted < s.admitCap && len(s.admitting) > 0 {
		i := slices.IndexFunc(s.admitting, (*queueState).light)
		if i < 0 {
			i = s.admitNext % len(s.admitting)
			s.admitNext = i + 1
		}
		l := s.admitting[i]
		if !l.failed {
			// One request, then the next queue's turn.
			tag := l.waiting[l.waitHead]
			l.waitHead = (l.waitHead + 1) % len(l.waiting)
			l.waitLen--
			l.tags[tag].admitted = true
			s.admitted++
			l.tally.backing-- // counted again by issue
			if err := l.issue(tag); err != nil {
				l.fail(err)
			}
		}
		if l.waitLen > 0 && !l.failed {
			continue
		}
		// A failed queue issues nothing more: its held requests stay
		// with the kernel, which gives them to the next server.
		l.tally.backing -= int64(l.waitLen)
		l.inAdmitting, l.waitLen = false, 0
		s.admitting = slices.Delete(s.admitting, i, i+1)
		if s.admitNext > i {
			s.admitNext--
		}
	}
}

// setAdmitCap sets the thread's share of the disk as ThreadConfig.DiskSlots
// says: none (0, the default), a fixed share, or (negative) the smallest
// DiskSlots among its queues (one disk per node in practice; where they
// differ, the smallest keeps every disk within its slots). It runs when a
// queue comes or goes, not per round.
func (s *threadLoop) setAdmitCap() {
	switch n := s.t.cfg.DiskSlots; {
	case n == 0:
		s.admitCap = 0
	case n > 0:
		s.admitCap = n
	default:
		s.admitCap = 0
		for _, l := range s.slots {
			if l != nil && l.cfg.DiskSlots > 0 && (s.admitCap == 0 || l.cfg.DiskSlots < s.admitCap) {
				s.admitCap = l.cfg.DiskSlots
			}
		}
	}
	if s.admitCap == 0 {
		// Unbounded from now on: what waits goes at once.
		s.admitCap = int(^uint(0) >> 1)
		s.admit()
		s.admitCap = 0
	}
}
