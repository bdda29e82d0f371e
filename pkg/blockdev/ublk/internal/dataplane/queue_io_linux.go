package dataplane

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// The per-request path of the server thread. Nothing here allocates: errors
// that end the queue are preallocated, everything else is integers.

var (
	errNoSQE     = errors.New("no free sqe (ring accounting broken)")
	errBadTag    = errors.New("completion for a tag out of range")
	errCmdFailed = errors.New("ublk i/o command failed")
	// errBatchSlotBusy: batch mode found the next element array still
	// waiting for its command's CQE.
	errBatchSlotBusy = errors.New("batch element array still in flight")
)

// onCmd handles the completion of a FETCH or COMMIT_AND_FETCH: a new
// request for tag, or the end of the tag.
func (l *queueState) onCmd(tag uint16, res int32) error {
	l.s.parked--
	if int(tag) >= len(l.tags) {
		return errBadTag
	}
	t := &l.tags[tag]
	switch {
	case res == uapi.IOResOK:
	case res == uapi.IOResAbort:
		t.aborted = true
		l.aborted++
		l.mayEnd()
		return nil
	default:
		// -EINVAL (wrong thread, bad buffer), -EBUSY (fetch after the
		// queue was ready) …: the tag is dead; the queue ends once every
		// tag is, reporting the first such error.
		if l.cmdErr == nil {
			l.cmdErr = fmt.Errorf("%w: tag %d: %w", errCmdFailed, tag, unix.Errno(-res))
		}
		t.aborted = true
		l.aborted++
		l.mayEnd()
		return nil
	}
	if l.failed {
		// A failed queue takes no new request: the kernel holds it
		// as for a dead server, until the device is recovered.
		return nil
	}
	return l.accept(tag)
}

// accept starts serving the request the kernel handed over for tag.
func (l *queueState) accept(tag uint16) error {
	t := &l.tags[tag]
	t.req = l.descs.request(tag)
	t.plan = planFor(t.req, l.cfg.Target)
	t.done, t.retries, t.start, t.copied = 0, 0, monoNow(), false
	l.tally.inFlight++
	l.touched()
	l.s.serving++
	l.noteTailUse(t)
	if l.bufs != nil && t.plan.act <= actWrite && t.req.len > l.cfg.MaxIOBytes {
		// The kernel keeps requests within max_io_buf_bytes; a larger
		// one would overrun its buffer, so refuse it.
		return l.commit(tag, -int32(unix.EIO))
	}
	switch t.plan.act {
	case actFail:
		return l.commit(tag, t.plan.errno)
	case actComplete:
		return l.commit(tag, fullResult(t.req))
	}
	if l.throttle(tag, t.start) {
		return nil
	}
	return l.start(tag)
}

// issue queues the backing operation for the unserved part of tag's request.
func (l *queueState) issue(tag uint16) error {
	t := &l.tags[tag]
	off := uint64(t.req.off) + uint64(t.done)
	n := t.req.len - t.done
	if l.needsRun(t) && !l.pool.take(t) {
		l.waitRun(tag)
		return nil
	}
	if l.uc && !t.copied && t.done == 0 && (t.plan.act == actRead || t.plan.act == actWrite) {
		if !l.copyInline(t) && l.issueLinked(tag, off, n) {
			l.backingStarted()
			return nil
		}
		if t.plan.act == actWrite {
			// Small, or no room for the link: copied here.
			if res := l.copyIn(tag); res != 0 {
				return l.commit(tag, res)
			}
		}
	}
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	switch t.plan.act {
	case actRead:
		l.prepRW(sqe, tag, off, n)
	case actWrite:
		l.changed(off, n)
		l.prepRW(sqe, tag, off, n)
	case actFsync:
		sqe.PrepFsync(l.fileBacking, uring.IORING_FSYNC_DATASYNC)
	case actFallocate:
		l.changed(off, n)
		sqe.PrepFallocate(l.fileBacking, t.plan.mode, off, uint64(n))
	}
	sqe.Flags |= l.fileFlag
	if l.s.ab.handOff() {
		sqe.Flags |= uring.IOSQE_ASYNC
	}
	sqe.UserData = encodeUD(udBacking, l.slot, tag)
	l.backingStarted()
	if t.plan.act == actWrite {
		runWriteIssuedHook(off, n)
	}
	return nil
}

// changed records in the queue's change bitmap (QueueConfig.Changes) that
// the backing file's range [off, off+n) is about to change: when the
// operation is issued, not when the request arrives, so that a write held
// back (by a paused Gate, the rate limits or admission) until after a
// snapshot's cut is recorded after it, and before it completes, so that a
// write that fails halfway is recorded too. A retried or continued
// operation marks its range again, which costs a load.
func (l *queueState) changed(off uint64, n uint32) {
	if l.cfg.Changes != nil {
		l.cfg.Changes.Mark(int64(off), int64(n))
	}
}

// backingStarted and backingEnded count a backing operation of the queue in
// the kernel: for the queue (its end waits for none), its thread (the batch
// wait) and its device (Pause waits for none).
func (l *queueState) backingStarted() {
	l.backing++
	l.s.backing++
	l.tally.backing++
	l.touched()
}

func (l *queueState) backingEnded() {
	l.backing--
	l.s.backing--
	if l.tally.backing--; l.tally.backing == 0 {
		l.q.hooks.backingIdle()
	}
	l.touched()
	if l.backing == 0 && (l.failed || l.aborted > 0) {
		l.mayEnd()
	}
}

// prepRW fills a read or write of n bytes at off. In zero-copy mode the
// request's own pages are fixed buffer #tag (registered by the kernel with
// AUTO_BUF_REG) and addr is the offset into them; in copy mode the data
// goes through the tag's buffer, as fixed buffer #tag when it lies within
// the buffer's registered head. Either way the fixed buffer is the tag's
// slot of the thread's buffer table, bufBase + tag.
func (l *queueState) prepRW(sqe *uring.SQE, tag uint16, off uint64, n uint32) {
	t := &l.tags[tag]
	write := t.plan.act == actWrite
	fixed := !l.zc && t.runLen == 0 && t.done+n <= l.fixed && l.registerHead(tag, t.done+n)
	f, slot := l.fileBacking, l.bufBase+tag
	switch {
	case l.zc && write:
		sqe.PrepRW(uring.IORING_OP_WRITE_FIXED, f, uint64(t.done), n, off)
		sqe.BufIndex = slot
	case l.zc:
		sqe.PrepRW(uring.IORING_OP_READ_FIXED, f, uint64(t.done), n, off)
		sqe.BufIndex = slot
	case fixed && write:
		sqe.PrepRW(uring.IORING_OP_WRITE_FIXED, f, l.dataAddr(tag, t.done), n, off)
		sqe.BufIndex = slot
	case fixed:
		sqe.PrepRW(uring.IORING_OP_READ_FIXED, f, l.dataAddr(tag, t.done), n, off)
		sqe.BufIndex = slot
	case write:
		sqe.PrepRW(uring.IORING_OP_WRITE, f, l.dataAddr(tag, t.done), n, off)
	default:
		sqe.PrepRW(uring.IORING_OP_READ, f, l.dataAddr(tag, t.done), n, off)
	}
	sqe.OpFlags = t.plan.rwFlags
	if write && t.retries < nowaitTries && l.nowaitOK() {
		sqe.OpFlags |= unix.RWF_NOWAIT
		l.freshenMtime()
	}
}

// onBacking handles a backing-file completion: continue a short transfer,
// retry -EAGAIN, or commit the full byte count or the error.
func (l *queueState) onBacking(tag uint16, res int32) error {
	if int(tag) >= len(l.tags) {
		return errBadTag
	}
	if l.q.hooks.eagain() {
		res = -int32(unix.EAGAIN)
	}
	if t := &l.tags[tag]; t.link > 0 {
		t.linkRes = res
		return l.linkCQE(tag)
	}
	return l.onBackingResult(tag, res)
}

// onBackingResult goes on from the result of tag's backing operation.
func (l *queueState) onBackingResult(tag uint16, res int32) error {
	t := &l.tags[tag]
	switch {
	case res == -int32(unix.EAGAIN) && t.retries < MaxEAGAIN:
		if t.plan.act == actWrite && l.cfg.Options.NowaitWrites && t.retries < nowaitTries {
			l.nowaitRefused(t)
		}
		t.retries++
		return l.reissue(tag)
	case res < 0:
		l.backingEnded()
		return l.commit(tag, res)
	case t.plan.act == actRead || t.plan.act == actWrite:
		if res == 0 {
			// End of file or a device that took nothing: never
			// commit a short count the kernel would requeue forever.
			l.backingEnded()
			return l.commit(tag, -int32(unix.EIO))
		}
		t.done += uint32(res)
		if t.done < t.req.len {
			t.retries = 0
			return l.reissue(tag)
		}
	}
	l.backingEnded()
	if l.uc && t.plan.act == actRead && !t.copied {
		if res := l.copyOut(tag); res != 0 {
			return l.commit(tag, res)
		}
	}
	return l.commit(tag, fullResult(t.req))
}

// reissue issues the rest of tag's request in place of its backing
// operation that just completed. The new one is counted before the old one
// ends, so the device's count never reads zero in between: Settled, which
// Pause waits on from another goroutine, would take that for a device with
// nothing left to write, while the retried or continued write is still to
// be issued (and a closed Gate does not hold it).
func (l *queueState) reissue(tag uint16) error {
	err := l.issue(tag)
	l.backingEnded()
	return err
}

// nowaitTries is how many times a write is first tried with RWF_NOWAIT,
// when QueueOptions.NowaitWrites asks for it.
//
// A direct write that must also update the backing file's mtime (the first
// write in each tick of the coarse clock file timestamps use) cannot go
// without blocking on newer kernels (ext4 in 7.3 refuses it; 6.12's updated
// the time inline), and io_uring would hand it, and every other write
// submitted before the update is done, to its io-wq worker threads: a
// good share of the writes, each a hand-off to another thread and back
// (docs/benchmark-studies.md, "Figures behind code comments"). So the server thread updates the mtime itself,
// once per tick for the whole device, before the round's first write
// (freshenMtime), and sends its writes with RWF_NOWAIT: the kernel refuses
// the few that still meet a stale mtime (the tick turned) or the inode
// lock held by another queue's update with -EAGAIN instead of handing
// them off, and they are tried once more. A write refused twice is left to
// io-wq, and so is every write for the nowaitPause that follows.
const nowaitTries = 2

// nowaitPause is how long writes go without RWF_NOWAIT after one was
// refused twice. Writes into the holes of a sparse volume are refused every
// time (allocating blocks may block); for them each RWF_NOWAIT try only adds
// a round trip through the server thread before the same hand-off.
const nowaitPause = 100 * time.Millisecond

// nowaitRefused handles a write that RWF_NOWAIT refused (t.retries tries
// so far). The first refusal is tried again after another look at the
// clock (the tick may have turned since the round's freshenMtime); a second
// means something else (a hole to allocate) blocks the write, so it goes,
// and for nowaitPause every write goes, to the kernel's own hand-off, which
// costs no round trip through here.
func (l *queueState) nowaitRefused(t *tagState) {
	l.q.stats.nowaitRefused.Add(1)
	if t.retries == 0 {
		if l.recheckRound != l.s.round {
			l.recheckRound, l.mtimeRound = l.s.round, 0
		}
		return
	}
	l.q.stats.nowaitPauses.Add(1)
	l.nowaitOffUntil = monoNow() + int64(nowaitPause)
	t.retries = nowaitTries - 1
}

// nowaitOK says whether this round's writes try RWF_NOWAIT first.
func (l *queueState) nowaitOK() bool {
	return l.cfg.Options.NowaitWrites && l.s.roundAt >= l.nowaitOffUntil
}

// freshenMtime makes sure, before a RWF_NOWAIT write is sent, that the
// backing file's mtime (and so its ctime) is the current tick of the coarse
// clock, as the kernel would otherwise need to make it inside the write. It
// looks at the clock once per round (twice after a refusal), and the first
// queue of the device to claim a tick asks the device's MtimeToucher, which
// updates it off the server thread. A write sent before the update is done,
// or after one that failed, costs nothing but a refusal: it goes to io-wq,
// as it would without RWF_NOWAIT.
func (l *queueState) freshenMtime() {
	if l.mtimeRound == l.s.round {
		return
	}
	l.mtimeRound = l.s.round
	var now unix.Timespec
	if unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now) != nil {
		return
	}
	if l.mtime != nil && l.mtime.request(now.Nano()) {
		l.q.stats.mtimeUpdates.Add(1)
	}
}

// commit queues COMMIT_AND_FETCH for tag with result (bytes or -errno),
// which completes the request and re-arms the tag in one SQE, or in batch
// mode adds it to the round's COMMIT_IO_CMDS. Stats are recorded here,
// once per request.
func (l *queueState) commit(tag uint16, result int32) error {
	t := &l.tags[tag]
	if result == -int32(unix.EAGAIN) {
		result = -int32(unix.EIO)
	}
	l.tally.inFlight--
	l.s.serving--
	l.finishAdmitted(t)
	if t.runLen > 0 {
		l.giveRun(t)
	}
	l.tally.observe(t.req.op, t.req.len, result < 0, monoNow()-t.start)
	l.touched()
	if l.b != nil {
		l.b.owned--
		l.putElem(tag, result)
		return nil
	}
	l.tally.commits++
	return l.prepCmd(uapi.IOCommitAndFetchReq, tag, result)
}
