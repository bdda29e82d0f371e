package dataplane

import (
	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// USER_COPY (Linux 6.5+). The kernel neither copies nor pins anything at
// FETCH and COMMIT: the server moves a request's data itself, by reading
// (a WRITE's data) or writing (a READ's) /dev/ublkcN at the request's
// position (userCopyPos), and the copy runs in whichever thread does that.
//
//   - A small request (at most QueueOptions.CopyInlineBytes) is copied by
//     the server thread, a pread or pwrite in the round that serves it:
//     one system call, where copy mode copies in the thread's task work.
//   - A large one is copied by the kernel's io-wq workers: its copy and its
//     backing I/O go as two linked SQEs (IOSQE_IO_LINK), the copy first for
//     a WRITE, the backing read first for a READ. The char device cannot
//     be read or written without blocking (it has no FMODE_NOWAIT), so
//     io_uring hands every copy on it to io-wq, and a worker that finished
//     the copy of a WRITE issues the linked backing write itself. The
//     server thread sees the two CQEs and commits: the copy, the cost of
//     large I/O per byte, runs beside the thread instead of on it.
//
// A link that breaks (a failed copy, a short or failed backing read) ends
// with a CQE for each half, the second -ECANCELED; the tag waits for both
// (t.link), then commits the error or carries on unlinked. Plain READ and
// WRITE only: the char device copies to user addresses (READ_FIXED and
// WRITE_FIXED fail there on 6.12).

// DefaultCopyInlineBytes is QueueOptions.CopyInlineBytes when zero.
const DefaultCopyInlineBytes = 64 << 10

// copyInline reports whether the server thread copies tag's data itself.
func (l *queueState) copyInline(t *tagState) bool {
	n := l.cfg.Options.CopyInlineBytes
	if n == 0 {
		n = DefaultCopyInlineBytes
	}
	return t.req.len <= n
}

// copyIn reads a WRITE's data out of the request into tag's buffer, on
// the server thread. It returns 0, or the -errno to commit.
func (l *queueState) copyIn(tag uint16) int32 {
	t := &l.tags[tag]
	n, err := unix.Pread(l.cfg.CharFD, l.data(tag)[:t.req.len], userCopyPos(l.cfg.QID, tag, 0))
	t.copied = err == nil && n == int(t.req.len)
	return copyErr(n, err, t.req.len)
}

// copyOut writes a READ's data from tag's buffer into the request, on the
// server thread. It returns 0, or the -errno to commit.
func (l *queueState) copyOut(tag uint16) int32 {
	t := &l.tags[tag]
	n, err := unix.Pwrite(l.cfg.CharFD, l.data(tag)[:t.req.len], userCopyPos(l.cfg.QID, tag, 0))
	t.copied = err == nil && n == int(t.req.len)
	return copyErr(n, err, t.req.len)
}

// copyErr maps a copy of want bytes that moved n, or failed with err, to
// 0 or the -errno to commit.
func copyErr(n int, err error, want uint32) int32 {
	if errno, ok := err.(unix.Errno); ok {
		return -int32(errno)
	}
	if err != nil || n != int(want) {
		return -int32(unix.EIO)
	}
	return 0
}

// issueLinked queues tag's copy and backing I/O as two linked SQEs (see
// above), and reports false, queueing nothing, when the submission ring
// has no room for both at once: a link must reach the kernel in one
// io_uring_enter, so the caller then copies on the thread instead.
func (l *queueState) issueLinked(tag uint16, off uint64, n uint32) bool {
	if l.ring.SQSpace() < 2 {
		return false
	}
	t := &l.tags[tag]
	first, second := l.ring.GetSQE(), l.ring.GetSQE()
	copySQE, backing := first, second
	if t.plan.act == actRead {
		copySQE, backing = second, first
	}
	if t.plan.act == actWrite {
		l.changed(off, n)
	}
	l.prepRW(backing, tag, off, n)
	// A linked write runs on the io-wq worker that made its copy, where
	// it may block: RWF_NOWAIT would only have it refused.
	backing.OpFlags &^= unix.RWF_NOWAIT
	backing.Flags |= l.fileFlag
	backing.UserData = encodeUD(udBacking, l.slot, tag)
	op := uint8(uring.IORING_OP_READ) // a WRITE's data is read out of the request
	if t.plan.act == actRead {
		op = uring.IORING_OP_WRITE
	}
	copySQE.PrepRW(op, l.fileChar, l.dataAddr(tag, 0), t.req.len, uint64(userCopyPos(l.cfg.QID, tag, 0)))
	// io_uring would try it inline first and be refused (no
	// FMODE_NOWAIT): straight to io-wq.
	copySQE.Flags |= l.fileFlag | uring.IOSQE_ASYNC
	copySQE.UserData = encodeUD(udCopy, l.slot, tag)
	first.Flags |= uring.IOSQE_IO_LINK
	t.link, t.copyRes, t.linkRes = 2, 0, 0
	l.tally.offloaded++
	return true
}

// onCopy handles the CQE of a linked copy.
func (l *queueState) onCopy(tag uint16, res int32) error {
	if int(tag) >= len(l.tags) {
		return errBadTag
	}
	t := &l.tags[tag]
	t.copyRes = res
	return l.linkCQE(tag)
}

// linkCQE counts one CQE of tag's link and, once both came, goes on from
// their results: a failed copy fails the request, a broken READ link goes
// on unlinked (onBackingResult copies on the thread at its end).
func (l *queueState) linkCQE(tag uint16) error {
	t := &l.tags[tag]
	if t.link--; t.link > 0 {
		return nil
	}
	full := int32(t.req.len)
	switch {
	case t.plan.act == actWrite && t.copyRes != full:
		l.backingEnded()
		return l.commit(tag, copyErr(int(t.copyRes), errnoOf(t.copyRes), t.req.len))
	case t.plan.act == actWrite:
		t.copied = true
	case t.copyRes == full:
		t.copied = true
	case t.linkRes == full-int32(t.done):
		// The backing read was whole; the copy failed.
		l.backingEnded()
		return l.commit(tag, copyErr(int(t.copyRes), errnoOf(t.copyRes), t.req.len))
	}
	return l.onBackingResult(tag, t.linkRes)
}

// errnoOf is the error of a negative CQE result, nil otherwise.
func errnoOf(res int32) error {
	if res < 0 {
		return unix.Errno(-res)
	}
	return nil
}
