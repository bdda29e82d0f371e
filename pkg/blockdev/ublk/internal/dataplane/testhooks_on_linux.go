//go:build failpoint

package dataplane

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Test hooks: how tests, here and in package ublk (which serves real
// devices on this data plane), inject failures into a server thread and
// look inside it. Only test builds (-tags failpoint) have them; in the
// plugin they are empty and cost nothing (testhooks_off_linux.go).

// roundHook, when set, runs at the start of every round of every thread.
var roundHook atomic.Pointer[func(*threadLoop)]

// runRoundHook runs the round hook, if set, at the start of a round of s.
func runRoundHook(s *threadLoop) {
	if hook := roundHook.Load(); hook != nil {
		(*hook)(s)
	}
}

// ringCloseHook, when set, runs just before a thread's ring is closed.
var ringCloseHook atomic.Pointer[func(*threadLoop)]

// runRingCloseHook runs the ring-close hook, if set, for s.
func runRingCloseHook(s *threadLoop) {
	if hook := ringCloseHook.Load(); hook != nil {
		(*hook)(s)
	}
}

// setRingCloseHook sets (nil: clears) the ring-close hook.
func setRingCloseHook(f func(*threadLoop)) {
	if f == nil {
		ringCloseHook.Store(nil)
		return
	}
	ringCloseHook.Store(&f)
}

// queueHooks are a queue's failpoints.
type queueHooks struct {
	// faultEAGAIN is how many more of the queue's backing completions
	// its thread takes for -EAGAIN whatever the kernel answered.
	faultEAGAIN atomic.Int32
	// idle counts the times the queue's count of backing operations in
	// flight fell to zero.
	idle atomic.Int32
}

// backingIdle notes that the queue's backing count fell to zero.
func (h *queueHooks) backingIdle() { h.idle.Add(1) }

// BackingIdles returns how many times q's count of backing operations in
// flight fell to zero.
func (q *Queue) BackingIdles() int32 { return q.hooks.idle.Load() }

// eagain reports whether this backing completion is to read -EAGAIN.
func (h *queueHooks) eagain() bool {
	if h.faultEAGAIN.Load() > 0 {
		h.faultEAGAIN.Add(-1)
		return true
	}
	return false
}

// setRoundHook sets (nil: clears) the threads' round hook.
func setRoundHook(f func(*threadLoop)) {
	if f == nil {
		roundHook.Store(nil)
		return
	}
	roundHook.Store(&f)
}

// writeIssuedHook, when set, runs on a server thread each time it has
// issued a backing write: marked in the queue's change record and counted
// in flight, not yet submitted to the kernel.
var writeIssuedHook atomic.Pointer[func(off uint64, n uint32)]

func runWriteIssuedHook(off uint64, n uint32) {
	if hook := writeIssuedHook.Load(); hook != nil {
		(*hook)(off, n)
	}
}

// OnWriteIssued runs f on the server thread after it issued each backing
// write of n bytes at off, before the write is submitted: a write f makes
// wait is recorded and in flight, and its data not yet in the file. stop
// ends it.
func OnWriteIssued(f func(off uint64, n uint32)) (stop func()) {
	writeIssuedHook.Store(&f)
	return func() { writeIssuedHook.Store(nil) }
}

// FailWindow is where in its loop FailThreadAt makes a thread fail.
type FailWindow = failWindow

const (
	// FailBeforeEnter: the round's SQEs prepared, not yet submitted.
	FailBeforeEnter = atBeforeEnter
	// FailInEnter: the io_uring_enter done, its SQEs submitted and the
	// CQEs it brought reaped from the ring, none handled.
	FailInEnter = atInEnter
	// FailMidDispatch: the light queues' CQEs of the round handled (and
	// their SQEs submitted), the busy queues' not (if any).
	FailMidDispatch = atMidDispatch
	// FailRoundStart: at the start of a round, as FailThread.
	FailRoundStart = atRoundStart
)

var failWindowNames = [...]string{"before enter", "in enter", "mid dispatch", "round start"}

func (w failWindow) String() string { return failWindowNames[w] }

// FailWindows is every window, in order.
var FailWindows = []FailWindow{FailBeforeEnter, FailInEnter, FailMidDispatch, FailRoundStart}

// failHook, when set, runs at each FailWindow of every thread's loop.
var failHook atomic.Pointer[func(*threadLoop, FailWindow, int)]

// runFailHook runs the fail hook, if set; n is the round's CQEs.
func runFailHook(s *threadLoop, w FailWindow, n int) {
	if hook := failHook.Load(); hook != nil {
		(*hook)(s, w, n)
	}
}

// FailThreadAt makes th panic the next time its loop reaches window w with
// work in hand (w's CQEs, for the windows after an enter), and, when
// closeDelay > 0, holds the close of its ring that long after the thread
// has exited (the window between its last enter and the close). stop ends
// the injection.
func FailThreadAt(th *Thread, w FailWindow, closeDelay time.Duration) (stop func()) {
	hook := func(s *threadLoop, at FailWindow, n int) {
		if s.t == th && at == w && (n > 0 || w == FailBeforeEnter || w == FailRoundStart) {
			panic(fmt.Sprintf("injected failure (%v)", w))
		}
	}
	failHook.Store(&hook)
	if closeDelay > 0 {
		setRingCloseHook(func(s *threadLoop) {
			if s.t == th {
				time.Sleep(closeDelay)
			}
		})
	}
	th.Wake()
	return func() {
		failHook.Store(nil)
		setRingCloseHook(nil)
	}
}

// FailThread makes th panic at the start of its next round, as a thread
// that fails while it serves, and wakes it. stop ends the injection.
func FailThread(th *Thread) (stop func()) {
	setRoundHook(func(s *threadLoop) {
		if s.t == th {
			panic("injected failure")
		}
	})
	th.Wake()
	return func() { setRoundHook(nil) }
}

// BufferPages returns, over the copy-mode queues of th, how many pages of
// their buffers are resident, how many are registered as fixed buffers,
// and the most registered for one tag. It reads them on the thread itself,
// which it wakes, and gives up after wait.
func BufferPages(th *Thread, wait time.Duration) (resident, registered, most int, err error) {
	page := unix.Getpagesize()
	type result struct {
		resident, registered, most int
		err                        error
	}
	ch := make(chan result, 1)
	setRoundHook(func(s *threadLoop) {
		if s.t != th {
			return
		}
		var r result
		for _, l := range s.slots {
			if l == nil || l.bufs == nil {
				continue
			}
			vec := make([]byte, len(l.bufs.mem)/page)
			if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&l.bufs.mem[0])), uintptr(len(l.bufs.mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				r.err = fmt.Errorf("mincore of the buffers: %w", e)
				break
			}
			for _, v := range vec {
				r.resident += int(v & 1)
			}
			for i := range l.tags {
				n := int(l.tags[i].reg) / page
				r.registered += n
				r.most = max(r.most, n)
			}
		}
		select {
		case ch <- r:
		default:
		}
	})
	defer setRoundHook(nil)
	th.Wake()
	select {
	case r := <-ch:
		return r.resident, r.registered, r.most, r.err
	case <-time.After(wait):
		return 0, 0, 0, errors.New("the server thread did not run a round")
	}
}

// FaultEAGAIN makes the queue's thread take the next n of the queue's
// backing completions for -EAGAIN, whatever the kernel answered (the
// operation did run), so that the retry path can be driven.
func (q *Queue) FaultEAGAIN(n int32) { q.hooks.faultEAGAIN.Store(n) }

// FaultsLeft is how many injected -EAGAIN answers are still to come.
func (q *Queue) FaultsLeft() int32 { return q.hooks.faultEAGAIN.Load() }
