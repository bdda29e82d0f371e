package dataplane

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// Idle reclaim. In copy mode every tag has a buffer of max_io_buf_bytes,
// mapped lazily: small requests only ever touch its registered head, but
// one burst of large I/O makes every buffer it used resident, and that
// memory would stay with the volume for its life (8 MiB per device with
// the default geometry). A queue that has served large requests and then
// stays idle for QueueOptions.IdleReclaim gives the pages of the buffer
// tails, everything past the registered head, back to the kernel. They
// fault in again, zero-filled, on next use.

// DefaultIdleReclaim is the IdleReclaim the plugin uses: long enough that
// a volume streaming with pauses keeps its buffers, short enough that a
// burst of large I/O costs memory for seconds, not for the volume's life.
const DefaultIdleReclaim = 10 * time.Second

// noteTailUse records, at the arrival of a request, whether its data (which
// the kernel copies through the tag's buffer) reaches past the registered
// head.
func (l *queueState) noteTailUse(t *tagState) {
	if l.bufs != nil && t.req.len > l.fixed && (t.req.op == uapi.IOOpRead || t.req.op == uapi.IOOpWrite) {
		l.tailsUsed, l.tailsAt = true, t.start
		if !l.inTails {
			l.inTails = true
			l.s.tails = append(l.s.tails, l)
		}
	}
}

// reclaimArmed reports whether the buffer tails await a reclaim: reclaim
// is on, some tails were used, no request is in flight, and the ring
// defers task work. With DEFER_TASKRUN the kernel copies a new WRITE into
// its buffer only inside this thread's waiting io_uring_enter, so none can
// land between two madvise calls; without it, it could, and the queue
// never reclaims (nor bounds its waits for it).
func (l *queueState) reclaimArmed() bool {
	return l.cfg.Options.IdleReclaim > 0 && l.tailsUsed && l.tally.inFlight == 0 &&
		l.ring.Flags()&uring.IORING_SETUP_DEFER_TASKRUN != 0
}

// reclaimWait bounds a sleeping wait at now so that the queue wakes when
// its buffer tails fall due for reclaim; 0 means no bound. With requests
// in flight there is none: their completions end the wait anyway.
func (l *queueState) reclaimWait(now int64) time.Duration {
	if !l.reclaimArmed() {
		return 0
	}
	return max(time.Duration(l.tailsAt+int64(l.cfg.Options.IdleReclaim)-now), time.Millisecond)
}

// reclaimDue reports whether the buffer tails may be reclaimed at now: the
// last request that used them came IdleReclaim ago, and no buffer holds
// data for the kernel or for us. Every request has been committed and
// every commit consumed (in copy mode the kernel copies a read's data out
// of the buffer while it consumes the COMMIT), and the caller has just
// reaped nothing, so no delivered WRITE waits in a buffer.
func (l *queueState) reclaimDue(now int64) bool {
	return l.reclaimArmed() && now-l.tailsAt >= int64(l.cfg.Options.IdleReclaim) && l.ring.Unsubmitted() == 0
}

// reclaim drops the pages of every buffer tail (MADV_DONTNEED). The
// registered heads stay: the ring holds their pages pinned, and dropping
// them from the mapping would part the buffer from what the ring reads
// and writes.
func (l *queueState) reclaim() {
	for tag := range l.tags {
		// Best effort: madvise fails only for locked memory
		// (mlockall), whose tails simply stay resident.
		_ = l.bufs.dropTail(uint16(tag), l.tags[tag].reg)
	}
	_ = l.pool.drop()
	l.tailsUsed = false
	l.q.stats.reclaims.Add(1)
}

// dropTail gives back the pages of tag's buffer past its first head bytes.
func (b *bufArea) dropTail(tag uint16, head uint32) error {
	start := int(tag)*b.size + roundUp(int(head), unix.Getpagesize())
	end := (int(tag) + 1) * b.size
	if start >= end {
		return nil
	}
	return unix.Madvise(b.mem[start:end], unix.MADV_DONTNEED)
}
