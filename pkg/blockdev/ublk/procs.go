package ublk

import (
	"os"
	"runtime"
	"sync"
)

// Go runs goroutines on GOMAXPROCS processors (Ps). A queue thread that
// sleeps in io_uring_enter keeps its P, and when every P is held that way
// the runtime's monitor takes them back every 20 µs and wakes a thread to
// hold each, so that one is free for other work: thousands of wake-ups a
// second under load (in the VM, 2,000/s costing 15% of a vCPU with one
// volume's two queue threads on two CPUs), and a queue thread whose wait
// ends may find no P and park until one is free. A spare P stops both:
// while one is idle, the monitor leaves a short wait its P. (The other
// cause of such takes, a goroutine that outlives its time slice, is what
// the queue's offers handle: see uring.OfferInterval.)
//
// procs therefore raises GOMAXPROCS by one per running queue thread, up to
// twice the process's own value (beyond that the spare Ps would mostly
// multiply the garbage collector's workers and threads), and lowers it as
// queue threads end. An operator who sets GOMAXPROCS keeps it. The base is
// read once, at the first queue thread; from then on the runtime no longer
// follows changes of the container's CPU limit by itself (Go 1.25+ stops
// doing so once runtime.GOMAXPROCS is called), which a DaemonSet's fixed
// limit does not need.
var procs = procBudget{fixed: os.Getenv("GOMAXPROCS") != ""}

// procBudget sets GOMAXPROCS from the number of running queue threads.
type procBudget struct {
	mu      sync.Mutex
	fixed   bool // GOMAXPROCS was set by the operator: never change it
	base    int  // GOMAXPROCS before the first queue thread (0: not read yet)
	threads int  // running queue threads
}

// add counts n more running queue threads (n < 0: fewer) and sets
// GOMAXPROCS to the base plus the spare Ps they call for.
func (b *procBudget) add(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fixed {
		return
	}
	if b.base == 0 {
		b.base = runtime.GOMAXPROCS(0)
	}
	b.threads = max(0, b.threads+n)
	runtime.GOMAXPROCS(b.want()) // returns at once when unchanged
}

// want is the GOMAXPROCS for the current count.
func (b *procBudget) want() int { return b.base + min(b.threads, 2*b.base) }
