package dataplane

import (
	"errors"
	"runtime"
	"testing"
)

// TestDeviceThreadsOnePerDevice proves a per-device pool gives each
// device's queues one thread of their own while it is under its bound,
// reuses a thread whose devices all left, and past the bound puts a
// device's queues together on the least loaded thread. Host test: server
// threads need only io_uring.
func TestDeviceThreadsOnePerDevice(t *testing.T) {
	p, err := NewDeviceThreads(2, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Len() != 0 || p.Near() {
		t.Fatalf("new per-device pool: %d threads, near %v; want none, not near", p.Len(), p.Near())
	}
	a, err := p.Pick(2, 64)
	if err != nil || a[0] != a[1] {
		t.Fatalf("device a: %v, %v; want both queues on one thread", a, err)
	}
	b, err := p.Pick(2, 64)
	if err != nil || b[0] != b[1] || b[0] == a[0] {
		t.Fatalf("device b: %v, %v; want a thread of its own, not a's", b, err)
	}
	UnreserveAll(a, 64) // a's queues left: its thread is idle
	c, err := p.Pick(1, 64)
	if err != nil || c[0] != a[0] || p.Len() != 2 {
		t.Fatalf("device c: %v, %v (%d threads); want a's idle thread, no new one", c, err, p.Len())
	}
	d, err := p.Pick(2, 32)
	if err != nil || d[0] != d[1] || d[0] != c[0] {
		t.Fatalf("device d past the bound: %v, %v; want both queues on the least loaded thread (c's)", d, err)
	}
	if p.Len() != 2 {
		t.Fatalf("%d threads past a bound of 2", p.Len())
	}
}

// TestDeviceThreadsFull proves a per-device pool at its bound refuses a
// device no thread has room for, with ErrThreadFull, and books nothing.
func TestDeviceThreadsFull(t *testing.T) {
	p, err := NewDeviceThreads(1, ThreadConfig{Tags: 2 * QueueCost(64)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Pick(2, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pick(1, 64); !errors.Is(err, ErrThreadFull) {
		t.Fatalf("a device past the only thread's room: %v, want ErrThreadFull", err)
	}
	if got := p.Threads()[0].load(); got != 2*QueueCost(64) {
		t.Fatalf("thread load %d after a refused pick, want %d", got, 2*QueueCost(64))
	}
}

// TestDeviceThreadsReserveProcs proves a per-device pool keeps a P of the
// Go scheduler for each of its threads beside the process's own, unless the
// operator set GOMAXPROCS, and that a bad bound is refused.
func TestDeviceThreadsReserveProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // Setenv restores it; "" is unset for reserveProcs
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	p, err := NewDeviceThreads(4, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 3 {
		if _, err := p.Pick(1, 64); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := runtime.GOMAXPROCS(0), procs.base+3; got < want || procs.base < 1 {
		t.Fatalf("GOMAXPROCS %d with 3 server threads, want at least %d (the process's own %d, plus one each)", got, want, procs.base)
	}
	for _, bad := range []int{0, -1, MaxDeviceThreads + 1} {
		if _, err := NewDeviceThreads(bad, ThreadConfig{}); !errors.Is(err, errInvalid) {
			t.Errorf("NewDeviceThreads(%d): %v, want invalid", bad, err)
		}
	}
	if _, err := NewDeviceThreads(2, ThreadConfig{Pin: true}); !errors.Is(err, errInvalid) {
		t.Errorf("a pinned per-device pool: %v, want invalid", err)
	}
}

// TestDeviceThreadsWatched proves a per-device pool hands the threads it
// starts after Watch to the watcher too: the server heals a failed thread
// only if it watches it.
func TestDeviceThreadsWatched(t *testing.T) {
	p, err := NewDeviceThreads(2, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	watched := make(chan *Thread, 2)
	p.Watch(func(th *Thread) { watched <- th })
	picked, err := p.Pick(1, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-watched; got != picked[0] {
		t.Fatalf("watched thread %d, want the new thread %d", got.ID(), picked[0].ID())
	}
}

// TestDeviceThreadsShareWithoutRoom proves a per-device pool whose growth
// is limited (the pids limit leaves no room) starts its first thread all
// the same and puts later devices on the least loaded thread, and grows
// again once there is room.
func TestDeviceThreadsShareWithoutRoom(t *testing.T) {
	p, err := NewDeviceThreads(8, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	room := false
	p.LimitGrowth(func() bool { return room })
	a, err := p.Pick(2, 64)
	if err != nil || p.Len() != 1 {
		t.Fatalf("first device without room: %v, %v (%d threads); want the first thread", a, err, p.Len())
	}
	b, err := p.Pick(2, 64)
	if err != nil || b[0] != a[0] || p.Len() != 1 {
		t.Fatalf("second device without room: %v, %v (%d threads); want a's thread shared", b, err, p.Len())
	}
	room = true
	c, err := p.Pick(2, 64)
	if err != nil || c[0] == a[0] || p.Len() != 2 {
		t.Fatalf("third device with room: %v, %v (%d threads); want a thread of its own", c, err, p.Len())
	}
}

// TestDeviceThreadsCanStart proves a per-device pool says it can start a
// thread while under its bound (so that its threads all failing is not the
// end of serving, as it is for a shared pool), and not at its bound, and a
// shared pool never says so.
func TestDeviceThreadsCanStart(t *testing.T) {
	p, err := NewDeviceThreads(1, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.CanStart() {
		t.Fatal("empty per-device pool of bound 1: CanStart false")
	}
	if _, err := p.Pick(1, 64); err != nil {
		t.Fatal(err)
	}
	if p.CanStart() {
		t.Fatal("per-device pool at its bound: CanStart true")
	}
	s, err := NewThreads(1, ThreadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.CanStart() {
		t.Fatal("shared pool: CanStart true")
	}
}
