// The ublk data plane: one Queue per hardware queue of a device.
//
// Thread model: each queue runs on one goroutine that locks its OS thread
// for its whole life, sets up on QueueConfig.CPU, marks it PR_SET_IO_FLUSHER,
// creates its own io_uring (SINGLE_ISSUER|DEFER_TASKRUN|COOP_TASKRUN, with the
// engine's fallback), registers [ublkc, backing] as fixed files, maps the
// queue's descriptors read-only and FETCHes every tag. That thread is then
// the queue's ublk daemon: every IO command and every backing operation is
// issued from it, and it never blocks on anything but io_uring_enter.
//
// The loop (queue_loop_linux.go) submits every ready SQE and waits in one
// io_uring_enter, for a quarter of the backing I/O in flight (completions in
// batches when the queue is busy), reaps every CQE and advances once. With
// few requests in service it first polls, within Options.Poll, so that a
// low-depth round trip does not pay a sleep and a wake-up. Per request
// (queue_io_linux.go): the tag's completion → decode the descriptor (desc.go)
// → one backing SQE (READ/WRITE, FSYNC DATASYNC, FALLOCATE) → its completion
// → COMMIT_AND_FETCH with the full byte count or -errno. Short transfers are
// continued, -EAGAIN retried. Nothing on this path allocates. With
// UBLK_F_BATCH_IO (Linux 7.0+) requests come in batches through one
// multishot FETCH and a round's results go back in one COMMIT
// (queue_batch_linux.go).
//
// Buffers: with UBLK_F_AUTO_BUF_REG (Linux 6.16+) the kernel registers each
// request's pages in the queue ring's sparse buffer table at index = tag and
// the backing I/O is READ_FIXED/WRITE_FIXED on them (zero copy; no buffers of
// ours). Otherwise each tag has a MaxIOBytes buffer in one anonymous mapping
// and the driver copies between it and the request (copy mode); pages become
// resident on first use, except the heads that Options.FixedBuffers
// registers (pins) at start.
//
// Ending: STOP_DEV aborts every parked tag with -ENODEV; once all tags are
// aborted and no backing I/O is in flight, Wait returns nil. Stop wakes the
// thread through an eventfd polled in the ring and it leaves at once; closing
// the ring cancels the parked commands, so a device with USER_RECOVERY stays
// QUIESCED for the next process. In both cases the goroutine returns still
// locked, so the runtime discards the thread with its kernel state.

package ublk

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
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
	// per-tag buffer in copy mode.
	MaxIOBytes uint32
	// CPU is the queue's home CPU (from GET_QUEUE_AFFINITY); -1 for none.
	// The thread sets up there (the kernel allocates the ring and maps
	// the descriptors on that CPU's memory node) and FETCHes every tag,
	// then goes back to every CPU it may use, unless PinCPU. Why:
	// measured in a 2-vCPU VM (7.3, zero copy, medians of 2), a hard pin
	// puts the queue thread on the CPU of the task submitting to that
	// queue and costs 35-40% of 4k iodepth-32 IOPS with one job (reads
	// 16.4k vs 25.4k, writes 13.6k vs 21.2k) and 20% of iodepth-1
	// latency (512 vs 422 us), while two jobs do not care.
	CPU int
	// PinCPU keeps the queue thread pinned to CPU for its whole life.
	PinCPU bool
	// Target is the backing store: FileTarget or NullTarget.
	Target Target
	// Options are the queue thread's submission and wait policy.
	Options QueueOptions
	// Limiter paces reads and writes (queue_qos_linux.go); it is shared
	// by the device's queues. nil means unlimited.
	Limiter *qos.Limiter
	// MtimeTick is shared by the device's queues, so that one mtime
	// update per clock tick serves them all (freshenMtime). nil: the
	// queue keeps its own.
	MtimeTick *atomic.Int64
}

// QueueOptions are a queue thread's buffer, submission and wait policy;
// every queue of a device uses the same.
type QueueOptions struct {
	// FixedBuffers registers the first FixedHeadBytes of each copy-mode
	// buffer with the ring and uses READ_FIXED/WRITE_FIXED for backing I/O
	// that fits there: small requests skip pinning their pages every time
	// (6.12 VM, 4k at queue depth 32: 7-15% less server CPU per I/O).
	// Registering pins, so those heads are resident from the start (2 MiB
	// for 2 queues × 64 tags); larger requests pin per request, a small
	// cost next to their copy, and fault in the rest of a buffer on first
	// use. Ignored with zero copy.
	FixedBuffers bool
	// Poll bounds how long the queue thread keeps checking its rings for
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
	// NowaitWrites keeps the backing file's mtime current from the queue
	// thread and sends writes with RWF_NOWAIT, so that io_uring does not
	// hand the writes the kernel cannot issue inline over a stale mtime to
	// an io-wq worker (see nowaitTries). It pays where the filesystem
	// refuses such writes (ext4 in 7.3: random writes ×1.07–1.32 in the
	// VM) and costs a little where it does not (writes into a sparse
	// volume's holes, refused whatever the mtime: ×0.97 in 6.12 and 7.3),
	// so the Server turns it on where a probe finds the refusal
	// (ServerConfig.NowaitWrites).
	NowaitWrites bool
	// IOWQWorkers caps the io-wq workers of the queue thread (bounded
	// work: writes io_uring could not issue without blocking, fsync,
	// fallocate). 0 keeps the kernel's default (up to 4 per CPU). A
	// benchmark knob (ublk serve --iowq-workers), not set by the plugin.
	IOWQWorkers uint32
}

// ErrQueueStopped is what Wait returns when Stop ended the queue.
var ErrQueueStopped = errors.New("queue stopped")

// Queue serves one ublk hardware queue on its own locked OS thread, with
// its own io_uring. Its methods are safe for concurrent use; the serving
// state lives on the queue thread only (see queue_loop_linux.go).
type Queue struct {
	cfg      QueueConfig
	stats    queueStats
	waker    *uring.Waker
	stopping atomic.Bool
	done     chan struct{}
	err      error // set before done is closed
}

func (c *QueueConfig) validate() error {
	switch {
	case c.Depth == 0 || c.Depth > maxQueueDepth:
		return fmt.Errorf("depth %d: want 1..%d", c.Depth, maxQueueDepth)
	case c.QID >= maxNrQueues:
		return fmt.Errorf("queue id %d: want < %d", c.QID, maxNrQueues)
	case c.CharFD < 0:
		return fmt.Errorf("char device fd %d", c.CharFD)
	case c.Target.Kind == TargetFile && c.Target.FD < 0:
		return fmt.Errorf("backing file fd %d", c.Target.FD)
	case c.Target.Kind != TargetFile && c.Target.Kind != TargetNull:
		return fmt.Errorf("target kind %d", c.Target.Kind)
	case c.Flags&FlagAutoBufReg == 0 && c.Flags&(FlagUserCopy|FlagSupportZeroCopy) != 0:
		return fmt.Errorf("flags %#x: USER_COPY and manual zero copy are not supported, use AUTO_BUF_REG or copy mode", c.Flags)
	case c.Flags&FlagNeedGetData != 0:
		// PER_IO_DAEMON is fine: newer drivers always report it, and one
		// thread serving every tag of a queue is a valid per-I/O daemon.
		return fmt.Errorf("flags %#x: NEED_GET_DATA is not supported", c.Flags)
	case c.Flags&FlagAutoBufReg == 0 && (c.MaxIOBytes == 0 || c.MaxIOBytes%512 != 0):
		return fmt.Errorf("max i/o bytes %d: want a positive multiple of 512", c.MaxIOBytes)
	}
	return nil
}

// StartQueue starts the queue's goroutine on a locked OS thread and returns
// once every tag has been FETCHed (submitted to the kernel), or with an error.
// After an error nothing is left running.
func StartQueue(cfg QueueConfig) (*Queue, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("start queue %d of ublk %d: %w", cfg.QID, cfg.DevID, err)
	}
	w, err := uring.NewWaker()
	if err != nil {
		return nil, fmt.Errorf("start queue %d of ublk %d: %w", cfg.QID, cfg.DevID, err)
	}
	q := &Queue{cfg: cfg, waker: w, done: make(chan struct{})}
	ready := make(chan error, 1)
	go q.run(ready)
	if err := <-ready; err != nil {
		<-q.done
		return nil, fmt.Errorf("start queue %d of ublk %d: %w", cfg.QID, cfg.DevID, err)
	}
	return q, nil
}

// Wait returns when the queue has stopped: nil once every tag was aborted
// after STOP_DEV (-ENODEV), ErrQueueStopped after Stop, or the error that
// ended it. The thread exits locked so the runtime discards it.
func (q *Queue) Wait() error {
	<-q.done
	return q.err
}

// Done is closed when the queue has stopped.
func (q *Queue) Done() <-chan struct{} { return q.done }

// Stop makes the queue thread leave without committing anything more (used
// on shutdown-for-upgrade: devices with USER_RECOVERY then stay QUIESCED
// for the next process). It does not wait; call Wait. Stop is idempotent.
func (q *Queue) Stop() {
	if q.stopping.CompareAndSwap(false, true) {
		q.waker.Wake()
	}
}

// Stats returns a snapshot of the queue's counters.
func (q *Queue) Stats() QueueStats { return q.stats.snapshot() }

// run is the queue goroutine. It locks its OS thread for its whole life and
// never unlocks it: the thread carries per-thread kernel state (affinity,
// PR_SET_IO_FLUSHER, the ring's single issuer, the ublk daemon identity), so
// the runtime must discard it when the goroutine returns.
func (q *Queue) run(ready chan<- error) {
	runtime.LockOSThread()
	var l *loop
	defer func() {
		if r := recover(); r != nil {
			q.err = fmt.Errorf("queue %d of ublk %d: panic: %v", q.cfg.QID, q.cfg.DevID, r)
		}
		if l != nil {
			l.close()
		}
		q.waker.Close()
		select {
		case ready <- q.err: // setup failed or panicked before ready
		default:
		}
		close(q.done)
	}()
	l, err := q.setup()
	if err != nil {
		q.err = err
		return
	}
	// Deferred after the cleanup above, so it runs first: once done is
	// closed, the thread no longer counts.
	procs.add(1)
	defer procs.add(-1)
	if err := l.fetchAll(); err != nil {
		q.err = err
		return
	}
	if err := unpin(l.home); err != nil {
		q.err = err
		return
	}
	ready <- nil
	if err := l.serve(); err != nil {
		q.err = fmt.Errorf("queue %d of ublk %d: %w", q.cfg.QID, q.cfg.DevID, err)
	}
}

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

// unpin lets the set-up queue thread run on every CPU it could before.
func unpin(prev *unix.CPUSet) error {
	if prev == nil {
		return nil
	}
	if err := unix.SchedSetaffinity(0, prev); err != nil {
		return fmt.Errorf("restore cpu affinity: %w", err)
	}
	return nil
}
