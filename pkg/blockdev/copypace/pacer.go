package copypace

import (
	"context"
	"math"
	"time"
)

// burst is how far a copy may run ahead of its rate after a slow patch.
const burst = 20 * time.Millisecond

// Pacer paces one copy; one goroutine uses it.
type Pacer struct {
	g          *Governor
	rate       float64   // its own limit, bytes per second; +Inf: none
	floor      float64   // it moves at least this, pauses aside
	clock      time.Time // when its next bytes may start (GCRA)
	registered bool      // counted among the Governor's copies
	moved      int64     // bytes it moved
	expect     int64     // the most bytes it will move (0: unknown)
	by         time.Time // when it must be done (zero: no deadline)
}

// FinishBy tells the Pacer that the copy must be done by t (the deadline
// of the call that waits for it): it is then never held back so long that
// the bytes it still expects (Expect) could not be moved in time.
func (p *Pacer) FinishBy(t time.Time) { p.by = t }

// Expect tells the Pacer the most bytes the copy will move.
func (p *Pacer) Expect(n int64) { p.expect = n }

// Wait returns when the copy may move its next n bytes: after a pause of
// the Governor's, if one is on, and once its rate allows them: its own
// limit, or its share of the Governor's allowance while a volume is in use
// if that is lower, but never below its floor (see FinishBy). Wait(ctx, 0)
// only waits for a pause, for a copy that reads what it does not move
// (zeros).
func (p *Pacer) Wait(ctx context.Context, n int) error {
	if rate := p.limit(); n > 0 && !math.IsInf(rate, 1) {
		now := time.Now()
		start := p.clock
		if start.Before(now.Add(-burst)) {
			start = now.Add(-burst)
		}
		p.clock = start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
		if err := sleep(ctx, start.Sub(now)); err != nil {
			return err
		}
	}
	if p.registered {
		if err := p.g.waitPause(ctx); err != nil {
			return err
		}
	}
	p.moved += int64(n)
	p.g.moved.Add(int64(n))
	return nil
}

// limit is the copy's rate now, bytes per second (+Inf: none).
func (p *Pacer) limit() float64 {
	if !p.registered {
		return p.rate
	}
	return min(p.rate, max(p.g.share(), p.floor, p.inTime()))
}

// inTime is the rate that moves what the copy still expects by its
// deadline, with a margin (0 without a deadline; +Inf when the time is
// up, or nearly).
func (p *Pacer) inTime() float64 {
	if p.by.IsZero() || p.expect <= 0 {
		return 0
	}
	left := time.Until(p.by).Seconds() * deadlineShare
	if left < 1 {
		return math.Inf(1)
	}
	return float64(max(p.expect-p.moved, 0)) / left
}

// deadlineShare is the share of the time left to a deadline that the rest
// of a copy is paced to fill: the rest is room for its pauses, its sync,
// and the copy running slower than it is paced.
const deadlineShare = 0.5

// Close ends the copy's pacing. Idempotent.
func (p *Pacer) Close() {
	if p.registered {
		p.registered = false
		p.g.release()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
