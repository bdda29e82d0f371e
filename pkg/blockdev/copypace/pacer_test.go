package copypace

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// registered returns a Pacer of g counted among its copies, without the
// control loop (so that the test sets the allowance itself).
func registered(g *Governor, rate int64) *Pacer {
	p := &Pacer{g: g, rate: math.Inf(1), floor: floorRate(rate), registered: true}
	if rate > 0 {
		p.rate = float64(rate)
	}
	g.copies++
	return p
}

// TestPacerLimit: a copy moves at its share of the allowance while a
// volume is in use, split between the copies, but never above its own
// rate, never below its floor, and never so slowly that what it still
// expects misses its deadline.
func TestPacerLimit(t *testing.T) {
	const mib = 1 << 20
	g := New(Config{})
	a, b := registered(g, 200*mib), registered(g, 0)
	if got := a.limit(); got != 200*mib {
		t.Errorf("no allowance: limit %.0f, want its rate", got)
	}
	if got := b.limit(); !math.IsInf(got, 1) {
		t.Errorf("no allowance, no rate: limit %.0f, want none", got)
	}
	g.setAllowance(100 * mib)
	if got := a.limit(); got != 50*mib {
		t.Errorf("allowance 100 MiB/s for two: limit %.0f, want 50 MiB/s", got)
	}
	g.setAllowance(1 * mib)
	if got := a.limit(); got != 20*mib {
		t.Errorf("allowance below the floor: limit %.0f, want the floor, 20 MiB/s", got)
	}
	b.Expect(100 * mib)
	b.FinishBy(time.Now().Add(4 * time.Second))
	// 100 MiB in half the 4 s left: about 50 MiB/s, above the floor.
	if got := b.limit(); got < 49*mib || got > 60*mib {
		t.Errorf("100 MiB to move within 4 s: limit %.0f, want about 50 MiB/s", got)
	}
	b.FinishBy(time.Now().Add(time.Second))
	if got := b.limit(); !math.IsInf(got, 1) {
		t.Errorf("deadline nearly up: limit %.0f, want none", got)
	}
	a.Close()
	a.Close()
	if g.copies != 1 {
		t.Errorf("after Close twice: %d copies, want 1", g.copies)
	}
}

// TestPacerWaitsOutPause: while the Governor pauses, a copy's Wait holds
// it, and lets it go when the pause ends; a copy cancelled meanwhile gets
// its context's error.
func TestPacerWaitsOutPause(t *testing.T) {
	g := New(Config{})
	p := registered(g, 0)
	g.setPaused(true)
	done := make(chan error, 1)
	go func() { done <- p.Wait(context.Background(), 1<<20) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v during a pause", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.setPaused(false)
	if err := <-done; err != nil {
		t.Fatalf("Wait after the pause: %v", err)
	}
	if g.moved.Load() != 1<<20 {
		t.Errorf("moved %d, want 1 MiB", g.moved.Load())
	}

	g.setPaused(true)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- p.Wait(ctx, 1<<20) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled during a pause: %v", err)
	}
	g.setPaused(false)
}

// TestPacerOff: with a negative budget a Pacer keeps its own rate only:
// nothing is registered, no control loop starts, pauses do not hold it.
func TestPacerOff(t *testing.T) {
	g := New(Config{Budget: -1, Devices: func(context.Context) ([]string, error) {
		t.Error("the Governor looked at devices with pacing off")
		return nil, nil
	}})
	if !g.Off() {
		t.Fatal("Off() = false for a negative budget")
	}
	p := g.Pacer(0)
	defer p.Close()
	g.setPaused(true)
	defer g.setPaused(false)
	if err := p.Wait(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
	if st := g.Status(); st.Copies != 0 || g.running {
		t.Errorf("status %+v, running %v; want nothing registered", st, g.running)
	}
}
