package ublk

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// The per-request path of the queue thread. Nothing here allocates: errors
// that end the queue are preallocated, everything else is integers.

var (
	errNoSQE     = errors.New("no free sqe (ring accounting broken)")
	errBadTag    = errors.New("completion for a tag out of range")
	errCmdFailed = errors.New("ublk i/o command failed")
)

// onCmd handles the completion of a FETCH or COMMIT_AND_FETCH: a new
// request for tag, or the end of the tag.
func (l *loop) onCmd(tag uint16, res int32) error {
	if int(tag) >= len(l.tags) {
		return errBadTag
	}
	t := &l.tags[tag]
	switch {
	case res == ioResOK:
	case res == ioResAbort:
		t.aborted = true
		l.aborted++
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
		return nil
	}
	t.req = l.descs.request(tag)
	t.plan = planFor(t.req, l.cfg.Target.Kind)
	t.done, t.retries, t.start = 0, 0, monoNow()
	l.q.stats.inFlight.Add(1)
	l.noteTailUse(t)
	if l.bufs != nil && t.plan.act <= actWrite && t.req.len > uint32(l.bufs.size) {
		// The kernel keeps requests within max_io_buf_bytes; a larger
		// one would overrun the tag's buffer, so refuse it.
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
	return l.issue(tag)
}

// issue queues the backing operation for the unserved part of tag's request.
func (l *loop) issue(tag uint16) error {
	t := &l.tags[tag]
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	off := uint64(t.req.off) + uint64(t.done)
	n := t.req.len - t.done
	switch t.plan.act {
	case actRead, actWrite:
		l.prepRW(sqe, tag, off, n)
	case actFsync:
		sqe.PrepFsync(fileBacking, uring.IORING_FSYNC_DATASYNC)
	case actFallocate:
		sqe.PrepFallocate(fileBacking, t.plan.mode, off, uint64(n))
	}
	sqe.Flags |= uring.IOSQE_FIXED_FILE
	sqe.UserData = encodeUD(udBacking, tag)
	l.backing++
	return nil
}

// prepRW fills a read or write of n bytes at off. In zero-copy mode the
// request's own pages are fixed buffer #tag (registered by the kernel with
// AUTO_BUF_REG) and addr is the offset into them; in copy mode the data
// goes through the tag's buffer, as fixed buffer #tag when it lies within
// the buffer's registered head.
func (l *loop) prepRW(sqe *uring.SQE, tag uint16, off uint64, n uint32) {
	t := &l.tags[tag]
	write := t.plan.act == actWrite
	fixed := t.done+n <= l.fixed
	switch {
	case l.zc && write:
		sqe.PrepRW(uring.IORING_OP_WRITE_FIXED, fileBacking, uint64(t.done), n, off)
		sqe.BufIndex = tag
	case l.zc:
		sqe.PrepRW(uring.IORING_OP_READ_FIXED, fileBacking, uint64(t.done), n, off)
		sqe.BufIndex = tag
	case fixed && write:
		sqe.PrepRW(uring.IORING_OP_WRITE_FIXED, fileBacking, l.bufs.addr(tag, t.done), n, off)
		sqe.BufIndex = tag
	case fixed:
		sqe.PrepRW(uring.IORING_OP_READ_FIXED, fileBacking, l.bufs.addr(tag, t.done), n, off)
		sqe.BufIndex = tag
	case write:
		sqe.PrepRW(uring.IORING_OP_WRITE, fileBacking, l.bufs.addr(tag, t.done), n, off)
	default:
		sqe.PrepRW(uring.IORING_OP_READ, fileBacking, l.bufs.addr(tag, t.done), n, off)
	}
	sqe.OpFlags = t.plan.rwFlags
	if write && t.retries < nowaitTries && l.nowaitOK() {
		sqe.OpFlags |= unix.RWF_NOWAIT
	}
}

// onBacking handles a backing-file completion: continue a short transfer,
// retry -EAGAIN, or commit the full byte count or the error.
func (l *loop) onBacking(tag uint16, res int32) error {
	if int(tag) >= len(l.tags) {
		return errBadTag
	}
	l.backing--
	t := &l.tags[tag]
	switch {
	case res == -int32(unix.EAGAIN) && t.retries < maxEAGAIN:
		if t.plan.act == actWrite && l.cfg.Options.NowaitWrites && t.retries < nowaitTries {
			l.nowaitRefused(t)
		}
		t.retries++
		return l.issue(tag)
	case res < 0:
		return l.commit(tag, res)
	case t.plan.act == actRead || t.plan.act == actWrite:
		if res == 0 {
			// End of file or a device that took nothing: never
			// commit a short count the kernel would requeue forever.
			return l.commit(tag, -int32(unix.EIO))
		}
		t.done += uint32(res)
		if t.done < t.req.len {
			t.retries = 0
			return l.issue(tag)
		}
	}
	return l.commit(tag, fullResult(t.req))
}

// nowaitTries is how many times a write is first tried with RWF_NOWAIT,
// when QueueOptions.NowaitWrites asks for it.
//
// A direct write that must also update the backing file's mtime (the first
// write in each clock tick) cannot go without blocking on newer kernels
// (ext4 in 7.3 refuses it; 6.12's updated the time inline), and io_uring
// would hand it, and every other write submitted before the update is
// done, to its io-wq worker threads: measured under emulation on 7.3, one
// write in seven, each a hand-off to another thread and back. With
// RWF_NOWAIT the kernel returns -EAGAIN instead; the queue thread then
// updates the mtime itself, once per clock tick (touchBacking), and tries
// the writes again without blocking. A write refused twice, or refused
// with the mtime current, is left to io-wq, and so is every write for the
// nowaitPause that follows.
const nowaitTries = 2

// nowaitPause is how long writes go without RWF_NOWAIT after one was
// refused for another reason than the mtime. Writes into the holes of a
// sparse volume are refused every time (allocating blocks may block); for
// them each RWF_NOWAIT try only adds a round trip through the queue thread
// before the same hand-off, and the mtime updates contend with the
// allocations for the inode lock.
const nowaitPause = 100 * time.Millisecond

// nowaitRefused handles a write that RWF_NOWAIT refused (t.retries tries
// so far): the first refusal updates the mtime and tries again without
// blocking; a refusal with the mtime current means something else (a hole
// to allocate) blocks the write, so it goes, and for nowaitPause every
// write goes, to the kernel's own hand-off, which costs no round trip
// through here.
func (l *loop) nowaitRefused(t *tagState) {
	l.q.stats.nowaitRefused.Add(1)
	if t.retries == 0 && l.touchBacking() {
		return
	}
	l.q.stats.nowaitPauses.Add(1)
	l.nowaitOffUntil = monoNow() + int64(nowaitPause)
	t.retries = nowaitTries - 1
}

// nowaitOK says whether this round's writes try RWF_NOWAIT first.
func (l *loop) nowaitOK() bool {
	return l.cfg.Options.NowaitWrites && l.roundAt >= l.nowaitOffUntil
}

// touchBacking makes sure the backing file's mtime (and so its ctime) is
// now, as a write refused with -EAGAIN would have done, and reports whether
// trying that write again without blocking can succeed. One update per tick
// of the coarse clock, which file timestamps use, serves every queue of the
// device: the first queue to claim the tick updates, the others only retry
// (their refusals came before, or during, that update, which holds the
// inode lock). Each queue gets one such pass per tick: every refusal of the
// round that took it is retried; a refusal in a later round of the same
// tick says no, as it then had another cause. On an error the write goes to
// io-wq, as it would without RWF_NOWAIT: nothing is lost.
func (l *loop) touchBacking() bool {
	if l.touched {
		return true
	}
	var now unix.Timespec
	if unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now) != nil {
		return false
	}
	tick := now.Nano()
	if tick == l.touchedAt {
		return false
	}
	l.touchedAt = tick
	if last := l.mtimeTick.Load(); last == tick || !l.mtimeTick.CompareAndSwap(last, tick) {
		l.touched = true // another queue updated it in this tick
		return true
	}
	l.touched = touchMtime(l.cfg.Target.FD) == nil
	return l.touched
}

// commit queues COMMIT_AND_FETCH for tag with result (bytes or -errno),
// which completes the request and re-arms the tag in one SQE. Stats are
// recorded here, once per request.
func (l *loop) commit(tag uint16, result int32) error {
	t := &l.tags[tag]
	if result == -int32(unix.EAGAIN) {
		result = -int32(unix.EIO)
	}
	l.q.stats.inFlight.Add(-1)
	l.q.stats.observe(t.req.op, t.req.len, result < 0, monoNow()-t.start)
	return l.prepCmd(ioCommitAndFetchReq, tag, result)
}
