// Reaping completions.
//
// Soundness: r.cqes points into the mmapped CQ ring (valid until Close);
// cq.tail is loaded atomically before the CQEs it covers are read, and
// cq.head is stored atomically after they were copied out.

package uring

import (
	"sync/atomic"
	"unsafe"
)

// Reap copies every available CQE (up to len(buf)) into buf, advances the
// CQ head once, and returns how many it copied. When the CQ is empty but the
// kernel holds overflowed CQEs or deferred task work, it first flushes them
// with a GETEVENTS enter. It returns 0 after Close.
func (r *Ring) Reap(buf []CQE) int {
	if r.closed || len(buf) == 0 {
		return 0
	}
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	if tail == head && r.needsFlush() {
		r.flush()
		tail = atomic.LoadUint32(r.cqTail)
	}
	n := min(tail-head, uint32(len(buf)))
	var done uint32
	for i := range n {
		c := (*CQE)(unsafe.Add(r.cqes, uintptr((head+i)&r.cqMask)*unsafe.Sizeof(CQE{})))
		buf[i] = *c
		if c.Flags&IORING_CQE_F_MORE == 0 {
			done++
		}
	}
	if n > 0 {
		atomic.StoreUint32(r.cqHead, head+n)
	}
	r.inflight -= min(done, r.inflight)
	return int(n)
}

// flush runs deferred task work and moves overflowed CQEs into the CQ.
func (r *Ring) flush() {
	for {
		r.enters++
		_, err := enter(r.enterFD, 0, 0, IORING_ENTER_GETEVENTS|r.enterFlags, nil, 0)
		if err == nil || !isEINTR(err) {
			return
		}
	}
}

// Ready returns how many CQEs are in the CQ now, without entering the
// kernel.
func (r *Ring) Ready() int {
	if r.closed {
		return 0
	}
	return int(atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead))
}
