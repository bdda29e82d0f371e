// Handing out SQEs, the bounded pending queue, and submission.
//
// Soundness: SQE pointers point into the mmapped SQE array (valid until
// Close) or into r.pending (Go heap, kept alive by r). Kernel-shared
// indices are read and written with sync/atomic.

package uring

import (
	"fmt"
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
	return queued < r.sqEntries && r.inflight+queued < r.cqBound
}

// SQSpace returns how many SQEs GetSQE can place directly in the SQ now.
func (r *Ring) SQSpace() int {
	if r.closed || r.pLen > 0 {
		return 0
	}
	queued := r.unsubmitted()
	return int(min(r.sqEntries-queued, r.cqBound-min(r.cqBound, r.inflight+queued)))
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
// matches unix.ETIME. EINTR is retried. It returns how many SQEs the kernel
// consumed; those it did not stay queued (Unsubmitted) for a later call.
//
// The kernel may take fewer SQEs than offered. An SQE that fails at
// submission ends its batch: the SQEs after it are submitted by the next
// io_uring_enter of the same call. EAGAIN or EBUSY (no memory for requests,
// or on old kernels a CQ overflow it cannot flush) take none: when CQEs
// wait in the CQ the call returns at once for the caller to reap, otherwise
// it waits for a completion for a short, growing while (refusedWaitMin to
// refusedWaitMax, within the timeout) and tries again. A kernel that
// refuses for refusedLimit with nothing completing makes the call fail
// with an error matching the errno. The wait never counts SQEs the kernel
// has not taken, so it cannot wait for completions that will not come.
func (r *Ring) SubmitAndWait(minComplete uint32, timeout time.Duration) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	r.movePending()
	atomic.StoreUint32(r.sqTail, r.sqLocal)
	var deadline time.Time
	if timeout > 0 && minComplete > 0 {
		deadline = time.Now().Add(timeout)
	}
	return r.enterLoop(minComplete, deadline)
}

// Refused submissions are retried after a timed wait for a completion,
// starting at refusedWaitMin and doubling up to refusedWaitMax, for at most
// refusedLimit without any completion.
const (
	refusedWaitMin = time.Millisecond
	refusedWaitMax = 64 * time.Millisecond
	refusedLimit   = 2 * time.Second
)

// enterLoop calls io_uring_enter until the SQ is consumed and the wait is
// satisfied, or the deadline passes, or the kernel keeps refusing, or an
// error. Each round recomputes what to submit and to wait for from the
// kernel's SQ head and the in-flight count, so SQEs the kernel did not take
// are neither counted nor waited for.
func (r *Ring) enterLoop(minComplete uint32, deadline time.Time) (int, error) {
	done := 0
	flush := r.needsFlush()
	var pause time.Duration // wait before retrying a refused submission
	var refusedAt time.Time // first refusal since the last progress
	for {
		toSubmit := r.unsubmitted()
		want := min(minComplete, r.inflight+toSubmit)
		var flags uint32
		if want > 0 || flush {
			flags = IORING_ENTER_GETEVENTS
		}
		if toSubmit == 0 && flags == 0 {
			return done, nil
		}
		var timed time.Time
		if want > 0 {
			timed = deadline
		}
		n, err := r.enterUntil(toSubmit, want, flags, timed)
		switch err {
		case nil:
			r.inflight += uint32(n)
			done += n
			flush = false
			if n > 0 {
				pause, refusedAt = 0, time.Time{}
			}
			if uint32(n) < toSubmit {
				if n == 0 {
					// Nothing taken and no error: treat it as
					// a refusal so the loop cannot spin.
					if err := r.refused(unix.EAGAIN, &pause, &refusedAt, deadline); err != nil {
						return done, err
					}
					if r.Ready() > 0 {
						return done, nil
					}
				}
				// A failed SQE ended the kernel's batch and
				// its wait: submit the rest.
				continue
			}
			if want == 0 || r.Ready() >= int(want) {
				return done, nil
			}
			// The wait was cut short (a signal): keep waiting.
		case unix.EINTR:
			r.intrs++
			// Nothing was consumed (the kernel returns the count when
			// it consumed any); retry with the same deadline.
		case unix.EAGAIN, unix.EBUSY:
			if r.Ready() > 0 {
				// The caller reaps first; the SQEs stay queued.
				return done, nil
			}
			if err := r.refused(err, &pause, &refusedAt, deadline); err != nil {
				return done, err
			}
			if r.Ready() > 0 {
				return done, nil
			}
		default:
			return done, err
		}
	}
}

// refused handles a submission the kernel refused with errno: unless the
// deadline or refusedLimit has passed, it waits up to *pause (doubled from
// refusedWaitMin) for a completion, which frees what the kernel lacked.
func (r *Ring) refused(errno error, pause *time.Duration, since *time.Time, deadline time.Time) error {
	now := time.Now()
	if since.IsZero() {
		*since = now
	} else if now.Sub(*since) >= refusedLimit {
		return fmt.Errorf("io_uring submit: kernel refused %d sqes for %v: %w", r.unsubmitted(), refusedLimit, errno)
	}
	*pause = min(max(2**pause, refusedWaitMin), refusedWaitMax)
	until := now.Add(*pause)
	if !deadline.IsZero() {
		if !now.Before(deadline) {
			return unix.ETIME
		}
		if deadline.Before(until) {
			until = deadline
		}
	}
	for {
		_, err := r.enterUntil(0, 1, IORING_ENTER_GETEVENTS, until)
		if err != unix.EINTR {
			return nil // a completion, or the pause is over: try again
		}
	}
}

// enterUntil calls io_uring_enter once; a non-zero deadline bounds its wait
// (IORING_ENTER_EXT_ARG). A deadline already passed returns unix.ETIME.
func (r *Ring) enterUntil(toSubmit, want, flags uint32, deadline time.Time) (int, error) {
	var arg unsafe.Pointer
	var argSize uintptr
	f := flags | r.enterFlags
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, unix.ETIME
		}
		r.ts.Sec, r.ts.Nsec = int64(left/time.Second), int64(left%time.Second)
		arg, argSize = unsafe.Pointer(&r.arg), unsafe.Sizeof(r.arg)
		f |= IORING_ENTER_EXT_ARG
	}
	r.enters++
	return enter(r.enterFD, toSubmit, want, f, arg, argSize)
}
