package dataplane

import (
	"os"
	"runtime"
	"sync"
)

// A server thread is a goroutine locked to its OS thread, and it runs Go
// code only while it holds a P of the Go scheduler. One that returns from
// io_uring_enter while every P is held waits, its request with it, until
// the runtime's monitor takes a P from a thread in a system call (20 us to
// 10 ms later): a second scheduler between a request and its server, the
// first being the kernel's. A per-device pool runs more threads than CPUs,
// so it keeps a P for each of them beside the ones the process started
// with: then a thread that wakes always finds one, and only the kernel
// decides who runs (docs/benchmark-studies.md, issue 54).

var procs struct {
	once sync.Once
	base int // GOMAXPROCS before any server thread asked for more
	mu   sync.Mutex
}

// reserveProcs raises GOMAXPROCS to the process's own plus threads, unless
// the operator set GOMAXPROCS. It never lowers it (a change stops the world
// for a moment; threads come and go only with devices).
func reserveProcs(threads int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	procs.once.Do(func() { procs.base = runtime.GOMAXPROCS(0) })
	procs.mu.Lock()
	defer procs.mu.Unlock()
	if want := procs.base + threads; runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}
