package dataplane

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// QueueConfig is what a queue needs from the control side.
type QueueConfig struct {
	DevID uint32
	QID   uint16
	Depth uint16
	// CharFD is the one open /dev/ublkcN fd, shared by all queues of the
	// device. The caller owns it and keeps it open until Wait returned.
	CharFD int
	// Flags are the negotiated UBLK_F_* flags as returned by ADD_DEV.
	// With FlagAutoBufReg the queue runs zero copy (the kernel registers
	// each request's pages in the queue's ring); otherwise it copies
	// through per-tag buffers. USER_COPY and manual SUPPORT_ZERO_COPY
	// without AUTO_BUF_REG are refused.
	Flags uint64
	// MaxIOBytes is the device's max_io_buf_bytes: the size of each
	// per-tag buffer in copy mode, and the largest request.
	MaxIOBytes uint32
	// PoolBytes is, with USER_COPY, the memory the queue lends to its
	// requests larger than a tag's buffer (UserCopyTagBytes), at least
	// MaxIOBytes (0: MaxIOBytes); see queue_pool_linux.go.
	PoolBytes int
	// Target is the backing store: FileTarget or NullTarget.
	Target Target
	// Options are the server thread's submission and wait policy.
	Options QueueOptions
	// Thread is the server thread that serves the queue.
	Thread *Thread
	// Limiter paces reads and writes (queue_qos_linux.go); it is shared
	// by the device's queues. nil means unlimited.
	Limiter *qos.Limiter
	// Gate pauses the device's queues (Device.Pause); shared by them.
	// nil: never paused.
	Gate *Gate
	// Reserved: Threads.Pick already booked the queue's room on Thread.
	// The queue owns the booking either way: it is given back when the
	// queue fails to start or ends.
	Reserved bool
	// Mtime is shared by the device's queues, so that one mtime update
	// per clock tick serves them all (freshenMtime). nil: the
	// queue keeps its own (with Options.NowaitWrites).
	Mtime *MtimeToucher
	// Changes records the ranges the queue's writes, discards and
	// write-zeroes change (package cbt): marked by the queue's thread,
	// cut by the device's owner. nil: not tracked.
	Changes *cbt.Bitmap
	// DiskSlots is the serving thread's share of the request slots of
	// the disk under the backing file: the most reads and writes the
	// thread keeps in flight there, holding the rest itself
	// (admission_linux.go). 0: unknown, no bound.
	DiskSlots int
}

// QueueOptions are the server thread's buffer, submission and wait policy;
// every queue of a device uses the same.
type QueueOptions struct {
	// FixedBuffers registers up to the first FixedHeadBytes of each
	// copy-mode buffer with the ring and uses READ_FIXED/WRITE_FIXED for
	// backing I/O that fits there: small requests skip pinning their pages
	// every time, which saves server CPU per I/O (docs/benchmark-studies.md,
	// "Figures behind code comments"). Registering pins, so a tag's head is registered when a request
	// first needs it, as far as the request reaches (4 KiB I/O pins 4 KiB
	// per tag used); larger requests pin per request, a small cost next to
	// their copy, and fault in the rest of a buffer on first use. Ignored
	// with zero copy.
	FixedBuffers bool
	// Poll bounds how long the server thread keeps checking its rings for
	// completions after a round that did work, before it sleeps in
	// io_uring_enter: it polls for twice its usual wait for the next
	// completion, and only while that wait is under Poll. 0 never polls. A sleep and wake-up per request is
	// most of a queue-depth-1 round trip; polling trades that for CPU
	// time, bounded by Poll per burst of activity.
	Poll time.Duration
	// IdleReclaim is how long a copy-mode queue stays idle after its
	// last request that used a buffer past the registered head before it
	// gives the pages of those buffer tails back (queue_reclaim_linux.go).
	// 0 never reclaims.
	IdleReclaim time.Duration
	// NowaitWrites keeps the backing file's mtime current from the server
	// thread and sends writes with RWF_NOWAIT, so that io_uring does not
	// hand the writes the kernel cannot issue inline over a stale mtime to
	// an io-wq worker (see nowaitTries). It pays where the filesystem
	// refuses such writes (ext4 in 7.3) and costs a little where it does
	// not (writes into a sparse volume's holes, refused whatever the
	// mtime; figures in docs/benchmark-studies.md, "Figures behind code
	// comments"), so the Server turns it on where a probe finds the
	// refusal (ServerConfig.NowaitWrites).
	NowaitWrites bool
	// CopyInlineBytes is, with USER_COPY, the largest request whose data
	// the server thread copies itself; larger ones are copied by io-wq
	// workers, linked to their backing I/O (queue_copy_linux.go). 0
	// means DefaultCopyInlineBytes.
	CopyInlineBytes uint32
}

// ErrQueueStopped is what Wait returns when the end of its server thread
// ended the queue.
var ErrQueueStopped = errors.New("queue stopped")

// Queue serves one ublk hardware queue on a server thread. Its methods are
// safe for concurrent use; the serving state lives on the thread only (see
// queue_state_linux.go).
type Queue struct {
	cfg     QueueConfig
	stats   queueStats
	thread  *Thread
	failure atomic.Pointer[error]
	done    chan struct{}
	err     error      // set before done is closed
	hooks   queueHooks // test failpoints (testhooks_on_linux.go); empty in the plugin
}

func (c *QueueConfig) validate() error {
	switch {
	case c.Thread == nil:
		return errors.New("no server thread")
	case c.Depth == 0 || c.Depth > uapi.MaxQueueDepth:
		return fmt.Errorf("depth %d: want 1..%d", c.Depth, uapi.MaxQueueDepth)
	case c.QID >= uapi.MaxNrQueues:
		return fmt.Errorf("queue id %d: want < %d", c.QID, uapi.MaxNrQueues)
	case c.CharFD < 0:
		return fmt.Errorf("char device fd %d", c.CharFD)
	case c.Target.Kind == TargetFile && c.Target.FD < 0:
		return fmt.Errorf("backing file fd %d", c.Target.FD)
	case c.Target.Kind != TargetFile && c.Target.Kind != TargetNull && c.Target.Kind != TargetFail:
		return fmt.Errorf("target kind %d", c.Target.Kind)
	case c.Flags&uapi.FlagAutoBufReg == 0 && c.Flags&uapi.FlagSupportZeroCopy != 0:
		return fmt.Errorf("flags %#x: manual zero copy is not supported, use AUTO_BUF_REG, USER_COPY or copy mode", c.Flags)
	case c.Flags&uapi.FlagUserCopy != 0 && c.Flags&uapi.FlagBatchIO != 0 && c.Flags&uapi.FlagAutoBufReg == 0:
		return fmt.Errorf("flags %#x: USER_COPY does not go with BATCH_IO", c.Flags)
	case c.Flags&uapi.FlagNeedGetData != 0:
		// PER_IO_DAEMON is fine: newer drivers always report it, and one
		// thread serving every tag of a queue is a valid per-I/O daemon.
		return fmt.Errorf("flags %#x: NEED_GET_DATA is not supported", c.Flags)
	case c.Flags&uapi.FlagAutoBufReg == 0 && (c.MaxIOBytes == 0 || c.MaxIOBytes%512 != 0):
		return fmt.Errorf("max i/o bytes %d: want a positive multiple of 512", c.MaxIOBytes)
	}
	return nil
}

// StartQueue starts serving the queue on cfg.Thread and returns once every tag has been FETCHed (submitted to
// the kernel), or with an error. After an error nothing of the queue is
// left running.
func StartQueue(cfg QueueConfig) (*Queue, error) {
	if err := cfg.validate(); err != nil {
		if cfg.Reserved && cfg.Thread != nil {
			cfg.Thread.unreserve(cfg.Depth)
		}
		return nil, fmt.Errorf("start queue %d of ublk %d: %w", cfg.QID, cfg.DevID, err)
	}
	q := &Queue{cfg: cfg, thread: cfg.Thread, done: make(chan struct{})}
	if err := q.start(); err != nil {
		return nil, fmt.Errorf("start queue %d of ublk %d: %w", cfg.QID, cfg.DevID, err)
	}
	return q, nil
}

// start maps the queue's memory and hands the queue to its thread.
func (q *Queue) start() error {
	if !q.cfg.Reserved {
		if err := q.thread.reserve(q.cfg.Depth); err != nil {
			return err
		}
	}
	l := newQueueState(q)
	var err error
	if l.descs, err = mapDescs(q.cfg.CharFD, q.cfg.QID, q.cfg.Depth); err == nil && !l.zc {
		l.bufs, l.pool, err = mapQueueMemory(&q.cfg, l.uc)
	}
	if err == nil {
		err = q.thread.start(l)
	}
	if err != nil && !l.attached {
		// The thread never took the queue: undo here. (One it took
		// ends on the thread, which then closes done.)
		l.teardown()
		q.thread.unreserve(q.cfg.Depth)
	}
	return err
}

// Wait returns when the queue has stopped: nil once every tag was aborted
// after STOP_DEV or QUIESCE_DEV (-ENODEV), ErrQueueStopped after the end
// of its thread, or the error that ended it.
func (q *Queue) Wait() error {
	<-q.done
	return q.err
}

// Done is closed when the queue has stopped.
func (q *Queue) Done() <-chan struct{} { return q.done }

// Err returns what went wrong with the queue: the failure that stopped it
// from serving (a rejected command, a broken ring, its thread's end), or
// nil while it serves or after a clean end.
func (q *Queue) Err() error {
	if p := q.failure.Load(); p != nil {
		return *p
	}
	select {
	case <-q.done:
		if errors.Is(q.err, ErrQueueStopped) {
			return nil
		}
		return q.err
	default:
		return nil
	}
}

// Thread returns the server thread serving the queue.
func (q *Queue) Thread() *Thread { return q.thread }

// RoundMark notes where the queue's thread is, for Settled.
func (q *Queue) RoundMark() uint64 { return q.thread.stats.rounds.Load() }

// Settled reports whether the queue's thread has begun two rounds since
// mark (RoundMark) and none of the queue's backing operations is in flight.
// A thread that began a round after a Gate closed saw it for every request
// of that round, and published the queue's backing count at its end, before
// it began the next: two rounds on, whatever it issued before is counted
// in backing, and once settled, a closed Gate's queue issues nothing more.
func (q *Queue) Settled(mark uint64) bool {
	return q.thread.stats.rounds.Load() >= mark+2 && q.stats.backing.Load() == 0
}

// Stats returns a snapshot of the queue's counters.
func (q *Queue) Stats() QueueStats { return q.stats.snapshot() }

// threadSetup moves the locked thread to its home CPU (so buffers are first
// touched on that CPU's memory node) and marks it an I/O flusher, so that
// memory reclaim never waits on the device this thread serves. It returns
// the thread's previous CPU mask for unpin (nil when it did not move).
func threadSetup(cpu int) (*unix.CPUSet, error) {
	var prev *unix.CPUSet
	if cpu >= 0 {
		prev = new(unix.CPUSet)
		if err := unix.SchedGetaffinity(0, prev); err != nil {
			return nil, fmt.Errorf("get cpu affinity: %w", err)
		}
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return nil, fmt.Errorf("pin to cpu %d: %w", cpu, err)
		}
	}
	// arg2 must be 1: 0 clears the flag. EPERM (no CAP_SYS_RESOURCE, as
	// in an unprivileged test) and EINVAL (kernel < 5.6) only cost the
	// reclaim protection, so they are not fatal.
	err := unix.Prctl(unix.PR_SET_IO_FLUSHER, 1, 0, 0, 0)
	if err != nil && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EINVAL) {
		return nil, fmt.Errorf("set io flusher: %w", err)
	}
	return prev, nil
}

// unpin lets the set-up server thread run on every CPU it could before.
func unpin(prev *unix.CPUSet) error {
	if prev == nil {
		return nil
	}
	if err := unix.SchedSetaffinity(0, prev); err != nil {
		return fmt.Errorf("restore cpu affinity: %w", err)
	}
	return nil
}
