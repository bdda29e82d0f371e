// Handing out SQEs, the bounded pending queue, and submission.
//
// Soundness: SQE pointers point into the mmapped SQE array (valid until
// Close) or into r.pending (Go heap, kept alive by r). Kernel-shared
// indices are read and written with sync/atomic.

package uring

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unsubmitted returns the SQ slots handed out but not yet consumed.
func (r *Ring) unsubmitted() uint32 { return r.sqLocal - atomic.LoadUint32(r.sqHead) }

// room reports whether one more SQE fits in the SQ and in the CQ budget.
func (r *Ring) room() bool {
	queued := r.unsubmitted()
	return queued < r.sqEntries && r.inflight+queued < r.cqEntries
}

// SQSpace returns how many SQEs GetSQE can place directly in the SQ now.
func (r *Ring) SQSpace() int {
	if r.closed || r.pLen > 0 {
		return 0
	}
	queued := r.unsubmitted()
	return int(min(r.sqEntries-queued, r.cqEntries-min(r.cqEntries, r.inflight+queued)))
}

// sqeAt returns SQ slot idx (already masked).
func (r *Ring) sqeAt(idx uint32) unsafe.Pointer {
	return unsafe.Add(r.sqes, uintptr(idx)<<r.sqeShift)
}

// GetSQE returns a zeroed SQE to prepare: an SQ slot when the rings have
// room, otherwise a slot of the pending queue. It returns nil when the ring
// is closed or the pending queue is full (Submit and Reap, then retry).
func (r *Ring) GetSQE() *SQE {
	p := r.getSQE()
	return (*SQE)(p)
}

// GetSQE128 is GetSQE for an SQE128 ring; it returns nil on a 64-byte ring.
func (r *Ring) GetSQE128() *SQE128 {
	if r.sqeShift != 7 {
		return nil
	}
	return (*SQE128)(r.getSQE())
}

func (r *Ring) getSQE() unsafe.Pointer {
	if r.closed {
		return nil
	}
	if r.pLen == 0 && r.room() {
		p := r.sqeAt(r.sqLocal & r.sqMask)
		r.zero(p)
		r.sqLocal++
		return p
	}
	if r.pLen == len(r.pending) {
		return nil
	}
	i := (r.pHead + r.pLen) % len(r.pending)
	r.pLen++
	r.pending[i] = SQE128{}
	return unsafe.Pointer(&r.pending[i])
}

func (r *Ring) zero(p unsafe.Pointer) {
	if r.sqeShift == 7 {
		*(*SQE128)(p) = SQE128{}
	} else {
		*(*SQE)(p) = SQE{}
	}
}

// movePending copies queued SQEs into the SQ while there is room.
func (r *Ring) movePending() {
	for r.pLen > 0 && r.room() {
		dst := r.sqeAt(r.sqLocal & r.sqMask)
		src := &r.pending[r.pHead]
		if r.sqeShift == 7 {
			*(*SQE128)(dst) = *src
		} else {
			*(*SQE)(dst) = src.SQE
		}
		r.sqLocal++
		r.pHead = (r.pHead + 1) % len(r.pending)
		r.pLen--
	}
}

// needsFlush reports whether the kernel holds completions (overflow list)
// or task work that only a GETEVENTS enter delivers.
func (r *Ring) needsFlush() bool {
	return atomic.LoadUint32(r.sqFlags)&(IORING_SQ_CQ_OVERFLOW|IORING_SQ_TASKRUN) != 0
}

// Submit hands every prepared SQE that fits to the kernel in one
// io_uring_enter, without waiting. It returns how many were consumed.
func (r *Ring) Submit() (int, error) {
	return r.SubmitAndWait(0, 0)
}

// SubmitAndWait hands every prepared SQE that fits to the kernel and, in the
// same io_uring_enter, waits until min(minComplete, in-flight) CQEs are
// available. A timeout > 0 bounds the wait; when it expires the error
// matches unix.ETIME. EINTR is retried; EBUSY/EAGAIN make it a plain wait
// and the SQEs are submitted by a later call. It returns how many SQEs the
// kernel consumed.
func (r *Ring) SubmitAndWait(minComplete uint32, timeout time.Duration) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	r.movePending()
	toSubmit := r.unsubmitted()
	atomic.StoreUint32(r.sqTail, r.sqLocal)
	want := min(minComplete, r.inflight+toSubmit)
	var flags uint32
	if want > 0 || r.needsFlush() {
		flags |= IORING_ENTER_GETEVENTS
	}
	if toSubmit == 0 && flags == 0 {
		return 0, nil
	}
	var deadline time.Time
	if timeout > 0 && want > 0 {
		deadline = time.Now().Add(timeout)
	}
	return r.enterLoop(toSubmit, want, flags, deadline)
}

// enterLoop calls io_uring_enter until it succeeds, times out or fails.
func (r *Ring) enterLoop(toSubmit, want, flags uint32, deadline time.Time) (int, error) {
	done := 0
	for {
		var arg unsafe.Pointer
		var argSize uintptr
		f := flags | r.enterFlags
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return done, unix.ETIME
			}
			r.ts.Sec, r.ts.Nsec = int64(left/time.Second), int64(left%time.Second)
			arg, argSize = unsafe.Pointer(&r.arg), unsafe.Sizeof(r.arg)
			f |= IORING_ENTER_EXT_ARG
		}
		r.enters++
		n, err := enter(r.enterFD, toSubmit, want, f, arg, argSize)
		switch err {
		case nil:
			r.inflight += uint32(n)
			done += n
			if toSubmit == 0 || want == 0 || r.Ready() >= int(want) {
				return done, nil
			}
			// The kernel returns the submit count even when its wait
			// was cut short (signal, timeout): keep waiting.
			toSubmit = 0
		case unix.EINTR:
			r.intrs++
			// Nothing was consumed (the kernel returns the count when
			// it consumed any); retry with the same deadline.
		case unix.EAGAIN, unix.EBUSY:
			if toSubmit == 0 || want == 0 {
				return done, nil
			}
			toSubmit = 0 // wait for completions; resubmit next time
		default:
			return done, err
		}
	}
}
