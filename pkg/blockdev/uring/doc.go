// Package uring is csi-fastblk's own io_uring engine, written directly on
// golang.org/x/sys/unix (no cgo, no third-party io_uring package). It knows
// io_uring and nothing else: no ublk, no CSI, no volumes.
//
// # What it offers
//
//   - [New] creates a [Ring] from a [Config]: SQ size, CQ size, setup flags
//     ([QueueFlags] is the set for a queue ring),
//     (SQE128 for ublk control rings; SINGLE_ISSUER, DEFER_TASKRUN,
//     COOP_TASKRUN and TASKRUN_FLAG for queue rings). Flags the kernel refuses
//     with EINVAL are dropped in a fixed order (DEFER_TASKRUN, then
//     SINGLE_ISSUER, then COOP_TASKRUN|TASKRUN_FLAG); [Ring.Flags] reports
//     what took. SQE128 and CQSIZE are never dropped. Accessors:
//     [Ring.FD], [Ring.SQEntries], [Ring.CQEntries], [Ring.Features],
//     [Ring.InFlight], [Ring.Pending], [Ring.SQSpace], [Ring.Ready] (CQEs
//     waiting, no syscall) and [Ring.Enters] (io_uring_enter calls made).
//   - [Ring.GetSQE] returns a zeroed *[SQE]; on an SQE128 ring
//     [Ring.GetSQE128] returns the same slot as *[SQE128], whose
//     [SQE128.Cmd] is the 80-byte command area. [SQE.Cmd] is the 16-byte area
//     at offset 48 of a 64-byte SQE. Prep helpers fill an SQE:
//     [SQE.PrepNop], [SQE.PrepRead], [SQE.PrepWrite], [SQE.PrepReadFixed],
//     [SQE.PrepWriteFixed], [SQE.PrepFsync], [SQE.PrepFallocate],
//     [SQE.PrepPollAdd], [SQE.PrepURingCmd] (cmd_op in the low 32 bits of
//     the offset field). The caller then sets fields directly:
//     sqe.UserData (a plain uint64: never a Go pointer), sqe.Flags |=
//     IOSQE_FIXED_FILE, sqe.OpFlags = unix.RWF_DSYNC (FUA) and so on.
//   - [Ring.Submit] hands every prepared SQE to the kernel in one
//     io_uring_enter; [Ring.SubmitAndWait] does the same and waits for
//     min(minComplete, in-flight) completions, with an optional timeout
//     (IORING_ENTER_EXT_ARG; a timed-out wait returns an error matching
//     unix.ETIME). EINTR is retried inside (the timeout keeps its deadline).
//     SQEs the kernel does not take stay queued ([Ring.Unsubmitted]) and
//     are never waited for: after an SQE that fails at submission the rest
//     go in the next enter; EBUSY and EAGAIN (kernel CQ backlog or no
//     request memory) return at once when CQEs wait to be reaped, else are
//     retried after short timed waits, and fail with the errno after two
//     seconds of refusals with nothing completing.
//   - [Ring.Reap] copies every available CQE into the caller's []CQE
//     (up to len) and advances the CQ head once. It also flushes a kernel
//     CQ overflow list (IORING_SQ_CQ_OVERFLOW) and pending task work
//     (IORING_SQ_TASKRUN) with a GETEVENTS enter when the CQ looks empty.
//   - Registered resources: [Ring.RegisterFiles], [Ring.UnregisterFiles],
//     [Ring.RegisterBuffers], [Ring.RegisterBuffersSparse] (an empty table
//     for ublk zero copy / AUTO_BUF_REG), [Ring.UnregisterBuffers],
//     [Ring.RegisterRingFD] (later enters use IORING_ENTER_REGISTERED_RING;
//     the registration belongs to the calling thread, so call it from the
//     ring's owner thread).
//   - [Waker]: an eventfd for cross-thread wake-ups. Another goroutine calls
//     [Waker.Wake]; the ring owner keeps a POLL_ADD on it armed with
//     [Waker.PrepPoll] and calls [Waker.Drain] when that CQE arrives.
//   - [Buffers] ([NewBuffers](n, size)): page-aligned memory from an
//     anonymous mmap, outside the Go heap, fit for O_DIRECT and for
//     registration ([Buffers.Slot](i) is the i-th slot, [Buffers.Slots]
//     all of them for [Ring.RegisterBuffers]).
//   - [Ring.RegisterBufRing] registers a provided-buffer ring ([BufRing],
//     5.19+): an operation sent with IOSQE_BUFFER_SELECT and the ring's
//     [BufRing.Group] has the kernel pick one of its buffers ([BufferID]
//     reads it from the CQE); [BufRing.Recycle] provides it again. Ublk's
//     multishot batch FETCH writes request tags into one.
//   - [Ring.SetMaxWorkers] caps io-wq workers for punted buffered I/O.
//   - Probes: [HaveSetupFlags], [HaveOp], and the named ones
//     ([HaveSQE128], [HaveSingleIssuer], [HaveDeferTaskrun],
//     [HaveCoopTaskrun], [HaveURingCmd]). nil means yes, an error wrapping
//     [ErrNotSupported] means no, anything else is inconclusive. Conclusive
//     answers are cached.
//
// # In-flight is bounded
//
// The engine never has more operations in the kernel than the CQ holds
// (in-flight + submitted-not-yet-reaped ≤ CQ entries) nor more unsubmitted
// SQEs than the SQ holds. When [Ring.GetSQE] cannot hand out an SQ slot it
// hands out a slot of an internal pending queue (capacity
// [Config.PendingEntries], default 4 × CQ entries); pending SQEs move to the
// SQ, in order, on later Submit calls as completions free room. GetSQE
// returns nil only when the pending queue is full too: the caller must then
// Submit/Reap before asking again. Nothing is dropped. A CQE with
// IORING_CQE_F_MORE (multishot) does not count as a completion. Link chains
// (IOSQE_IO_LINK) must fit in the SQ in one go: check [Ring.SQSpace] first.
// SQEs with IOSQE_CQE_SKIP_SUCCESS are counted as in flight until a CQE
// comes, so wait on them only with a timeout (or avoid them).
//
// Waits use IORING_ENTER_EXT_ARG (5.11) only when a timeout is given. The
// kernel returns from a wait early on signals; SubmitAndWait keeps waiting
// until min(minComplete, in-flight) CQEs are in the CQ or the deadline
// passes, so callers never see EINTR.
//
// # Caller duties (the ublk queue loop)
//
//  1. Lock the OS thread (runtime.LockOSThread) before New, and keep every
//     call on that thread: SINGLE_ISSUER binds the ring to its creator and
//     DEFER_TASKRUN runs completions only on the owner's GETEVENTS enter.
//  2. Per iteration: prepare every ready SQE, call SubmitAndWait once
//     (minComplete > 1 when enough is in flight), then Reap into a reused
//     []CQE and handle each CQE. No allocation happens on this path.
//  3. Before a wait that may sleep, submit, and when [OfferDue] says so
//     call runtime.Gosched: a locked thread that never reschedules has its
//     P taken by the runtime's monitor in the middle of its waits, which
//     then polls every 20 µs for a while (see [OfferInterval]).
//  4. To stop from another goroutine, Wake a Waker whose poll is armed in
//     the ring; the owner then returns from its wait and calls Close.
//  5. Buffers handed to PrepRead/PrepWrite must stay valid until their CQE:
//     use [Buffers] (outside the GC heap) or pin Go memory (runtime.Pinner).
//
// # Concurrency and ownership
//
// A Ring is not safe for concurrent use: it is owned by the goroutine (and
// locked thread) that created it, and Close must be called by that owner.
// A Ring owns its fd and mmaps; Close is idempotent, and every later call
// returns an error wrapping os.ErrClosed (GetSQE returns nil, Reap returns
// 0). A Waker is safe for concurrent use (Wake from anywhere). Buffers own
// their mapping; the caller must not use slots after Close.
//
// Package bench (pkg/blockdev/uring/bench) drives the engine like fio and is
// what `csi-fastblk bench engine` and hack/bench/engine.sh run.
//
// The UAPI definitions in zuapi_linux.go come from the kernel's
// include/uapi/linux/io_uring.h as shipped in Debian linux-libc-dev 6.1.187;
// a test checks every size and offset.
package uring
