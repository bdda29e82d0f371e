// Server threads: the data plane's OS threads.
//
// A Thread is one locked OS thread with one io_uring, serving the queues of
// many devices. Every queue belongs to one thread for its life (before
// UBLK_F_PER_IO_DAEMON, Linux 6.16, all FETCH and COMMIT commands of a queue
// must come from one task), and a server keeps a fixed set of threads, one
// per CPU it may use (Threads): threads do not multiply with volumes, and
// requests spread over many devices are still served in batches, one
// io_uring_enter submitting the round's SQEs of every device the thread
// serves and one wake-up reaping the completions of all of them.
//
// The ring's tables are shared: each queue has two slots of a sparse
// fixed-file table (its /dev/ublkcN and its backing file) and a run of
// slots of the sparse buffer table, one per tag (zero copy: the kernel
// registers each request's pages there, AUTO_BUF_REG; copy mode: the
// registered heads of the tag buffers). Slots are filled when a queue
// arrives and cleared when it leaves, on the thread, with
// IORING_REGISTER_FILES_UPDATE2 and IORING_REGISTER_BUFFERS_UPDATE.
//
// Control goroutines never touch the ring: a new queue is a message
// (Thread.start), the thread wakes on an eventfd polled in its ring, sets
// the queue up and FETCHes its tags before it answers; a queue leaves when
// its device ends it (STOP_DEV, or QUIESCE_DEV for a release) and the last
// tag has been aborted. A thread that fails (a panic, a ring error) exits,
// which cancels its ublk commands as a crashed server's; then its ring is
// closed from another goroutine and every queue it served ends with its
// error, which the devices report (Device.Err): devices with user recovery
// are quiesced, their I/O held, not lost. The queues' buffers stay mapped
// until the kernel has freed the ring (threadLoop.close). The Server then starts a thread
// in its place (Threads.Replace) and re-adopts those devices through user
// recovery (ublk's threadheal_linux.go); its Health fails until they are
// served again.

package dataplane

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// ThreadConfig sizes a server thread.
type ThreadConfig struct {
	// Tags is the most tags the thread serves at once, counting each
	// queue as its depth plus queueExtra. It sizes the completion ring
	// (each tag has one operation in flight, its parked command or its
	// backing I/O, so every CQE has room and none overflows) and the
	// buffer table (one slot per tag). 0 means DefaultThreadTags; at most
	// MaxThreadTags.
	Tags int
	// Queues is the most queues the thread serves at once (two fixed
	// files each); 0 means DefaultThreadQueues.
	Queues int
	// CPU, when >= 0, is where the thread sets up its ring; Pin keeps it
	// there for its life. NewThreads sets CPU per thread itself.
	CPU int
	Pin bool
	// Near pins the threads of a pool one per CPU (Pin) and places each
	// device queue on the thread of a CPU blk-mq maps to it
	// (Threads.PickNear), so that its requests and their completions stay
	// on the CPU that submitted them.
	Near bool
	// IOWQWorkers caps the thread's io-wq workers (bounded work: writes
	// io_uring could not issue without blocking, fsync, fallocate); 0
	// sizes it to the queues the thread serves (threadLoop.sizeIOWQ).
	IOWQWorkers uint32
	// Ablation switches techniques off for benchmarks (zero: none).
	Ablation Ablation
	// PollInFlight is the most requests the thread may be serving and
	// still poll (Options.Poll) before a sleeping wait; 0 means
	// pollMaxInFlight. A benchmark knob.
	PollInFlight int
	// Pollers, when set, bounds how many threads of a pool poll at once
	// (PollSlots); nil: no bound.
	Pollers *PollSlots
	// DiskSlots is the most reads and writes the thread keeps in flight
	// on the backing disk (admission_linux.go): 0 (the default) no
	// bound, negative its share of the disk's slots (QueueConfig.DiskSlots
	// of its queues). Off by default: measured in the VM it gained
	// nothing (docs/benchmark-studies.md, "Admission to the backing
	// disk"). A benchmark knob.
	DiskSlots int
}

const (
	// DefaultThreadTags serves 64 devices of two queues of depth 64 on
	// two threads with room to spare.
	DefaultThreadTags = 8192
	// MaxThreadTags is IORING_MAX_REG_BUFFERS: a buffer table holds no
	// more slots.
	MaxThreadTags = 1 << 14
	// DefaultThreadQueues bounds the fixed-file table (two per queue).
	DefaultThreadQueues = 256
	// queueExtra is a queue's cost beyond its depth: batch mode's FETCH
	// and element-array commands.
	queueExtra = commitSlots + 1
	// threadSQ bounds the submission ring; a round that prepares more
	// queues the rest in the engine's pending queue.
	threadSQ = 4096
)

// QueueCost is what a queue of depth tags takes of a thread's Tags.
func QueueCost(depth uint16) int { return int(depth) + queueExtra }

// ErrThreadDead is the class of the error a queue ends with when its
// server thread failed.
var ErrThreadDead = errors.New("server thread failed")

// Thread is one server thread. Its methods are safe for concurrent use;
// the serving state lives on the thread only (threadLoop).
type Thread struct {
	id    int
	cfg   ThreadConfig
	waker *uring.Waker

	mu     sync.Mutex
	mail   []*queueState // queues to start serving
	tags   int           // reserved by its queues (QueueCost each)
	queues int

	hasMail atomic.Bool
	closing atomic.Bool
	done    chan struct{}
	err     error // why it ended; nil after Close. Set before done closes.
	stats   threadStats
}

// NewThread starts a shared server thread. Queues join it with
// QueueConfig.Thread; it runs until Close or until it fails.
func NewThread(id int, cfg ThreadConfig) (*Thread, error) {
	if cfg.Tags <= 0 {
		cfg.Tags = DefaultThreadTags
	}
	if cfg.Queues <= 0 {
		cfg.Queues = DefaultThreadQueues
	}
	if cfg.Tags > MaxThreadTags || cfg.Queues > MaxThreadTags {
		return nil, fmt.Errorf("server thread %d: %d tags, %d queues: want at most %d: %w", id, cfg.Tags, cfg.Queues, MaxThreadTags, errInvalid)
	}
	w, err := uring.NewWaker()
	if err != nil {
		return nil, fmt.Errorf("server thread %d: %w", id, err)
	}
	t := &Thread{id: id, cfg: cfg, waker: w, done: make(chan struct{})}
	ready := make(chan error, 1)
	go t.run(ready)
	if err := <-ready; err != nil {
		<-t.done
		return nil, err
	}
	return t, nil
}

// ID is the thread's number in its server.
func (t *Thread) ID() int { return t.id }

// CPU is the CPU the thread is pinned to, or -1 if it floats.
func (t *Thread) CPU() int {
	if !t.cfg.Pin {
		return -1
	}
	return t.cfg.CPU
}

// Close makes the thread leave and waits for it. Its ring is closed, which
// cancels every parked command: devices with user recovery stay
// QUIESCED, their I/O held, for the next server. Every queue it served
// ends with ErrQueueStopped. Idempotent; it returns the thread's failure,
// if it failed before.
func (t *Thread) Close() error {
	t.stop()
	<-t.done
	return t.err
}

// stop asks the thread to leave without waiting.
func (t *Thread) stop() {
	if t.closing.CompareAndSwap(false, true) {
		t.waker.Wake()
	}
}

// Wake makes the thread run a round now.
func (t *Thread) Wake() { t.waker.Wake() }

// Done is closed when the thread has ended.
func (t *Thread) Done() <-chan struct{} { return t.done }

// Err returns why the thread failed, or nil while it runs or after Close.
func (t *Thread) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// load returns the tags reserved on the thread.
func (t *Thread) load() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tags
}

// reserve books room for a queue of depth; it fails with ErrThreadFull.
func (t *Thread) reserve(depth uint16) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	need := QueueCost(depth)
	if t.queues+1 > t.cfg.Queues || t.tags+need > t.cfg.Tags {
		return fmt.Errorf("server thread %d: %d queues and %d of %d tags taken, a queue of depth %d needs %d: %w",
			t.id, t.queues, t.tags, t.cfg.Tags, depth, need, ErrThreadFull)
	}
	t.queues++
	t.tags += need
	return nil
}

// unreserve gives back what reserve booked.
func (t *Thread) unreserve(depth uint16) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queues--
	t.tags -= QueueCost(depth)
}

// start hands the queue to the thread and waits until its tags have been
// FETCHed (submitted to the kernel), or the thread refused it.
func (t *Thread) start(l *queueState) error {
	t.mu.Lock()
	t.mail = append(t.mail, l)
	t.mu.Unlock()
	t.hasMail.Store(true)
	t.waker.Wake()
	select {
	case err := <-l.started:
		return err
	case <-t.done:
		// The thread ended; it answers every letter it took, and
		// the ones it did not take are answered here.
		select {
		case err := <-l.started:
			return err
		default:
		}
		return fmt.Errorf("server thread %d ended: %w", t.id, errors.Join(t.err, ErrQueueStopped))
	}
}

// takeMail returns the queues sent to the thread since the last call.
func (t *Thread) takeMail() []*queueState {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hasMail.Store(false)
	m := t.mail
	t.mail = nil
	return m
}

// Stats returns a snapshot of the thread's counters.
func (t *Thread) Stats() ThreadStats {
	t.mu.Lock()
	queues, tags := t.queues, t.tags
	t.mu.Unlock()
	s := t.stats.snapshot()
	s.ID, s.Queues, s.Tags = t.id, queues, tags
	s.Err = t.Err()
	return s
}

// ThreadStats is a snapshot of one server thread's counters.
type ThreadStats struct {
	ID     int
	Queues int // queues served now
	Tags   int // tags reserved by them
	// Enters counts io_uring_enter calls that waited, Rounds the rounds
	// of the loop, and CQEs the completions reaped: CQEs per enter is
	// the batching the thread achieves.
	Enters, Rounds, CQEs uint64
	// Stray counts CQEs for no queue of the thread (a bug if ever seen).
	Stray uint64
	// Err is why the thread failed (nil while it serves).
	Err error
}

type threadStats struct {
	enters, rounds, cqes, stray atomic.Uint64
}

func (s *threadStats) snapshot() ThreadStats {
	return ThreadStats{Enters: s.enters.Load(), Rounds: s.rounds.Load(), CQEs: s.cqes.Load(), Stray: s.stray.Load()}
}

// run is the thread's goroutine. It locks its OS thread for its whole life
// and never unlocks it: the thread carries per-thread kernel state (the
// ring's single issuer, the ublk daemon identity of its queues, io-wq,
// PR_SET_IO_FLUSHER), so the runtime must discard it when run returns.
//
// The thread does not close its own ring: finish does, once the OS thread
// has exited (see there). The process's main thread is never a server
// thread.
func (t *Thread) run(ready chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The process's main thread never exits (the runtime parks it
		// when its locked goroutine returns), so it cannot serve: the
		// thread would outlive its ring. Held here, it is not the
		// thread the new goroutine gets.
		moved := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(moved)
			t.serve(ready)
		}()
		<-moved
		runtime.UnlockOSThread()
		return
	}
	t.serve(ready)
}

// serve runs the thread on the OS thread its goroutine is locked to.
func (t *Thread) serve(ready chan<- error) {
	var s *threadLoop
	var err error
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
		if err != nil && !errors.Is(err, ErrQueueStopped) {
			t.err = fmt.Errorf("server thread %d: %w: %w", t.id, ErrThreadDead, err)
		}
		t.closing.Store(true)
		select {
		case ready <- t.err: // setup failed or panicked before ready
		default:
		}
		if s == nil {
			t.end()
			return
		}
		// The ring is left to the exit of the OS thread (which
		// cancels the thread's ublk commands as a crashed server's)
		// and then closed from another goroutine; the registered fd
		// is this thread's and goes first.
		_ = s.ring.UnregisterRingFD()
		go t.finish(s, unix.Gettid())
	}()
	if s, err = t.setup(); err != nil {
		return
	}
	ready <- nil
	err = s.serve()
}

// finish closes the ring of the thread, whose goroutine has returned, once
// its OS thread (tid) has exited, then ends its queues and the thread.
//
// Closing the ring while the thread lives is what a failed thread used to
// do, and it can leave a request owned by no one: the ring's exit moves
// the task work still pending onto the thread, and a ublk dispatch among it
// (a request started just before) then runs on the living daemon task and
// is handed to the dead ring, so the kernel's quiesce of the device waits
// for it for good, holding the device's mutex (issue 43: the heal wedge
// seen on 6.12). Once the task has exited, the driver aborts such a
// dispatch, as for a server that crashed.
func (t *Thread) finish(s *threadLoop, tid int) {
	waitTaskExit(tid, threadExitWait)
	s.close(t.err)
	t.end()
}

// end answers the queues still in the thread's mail and marks it done.
func (t *Thread) end() {
	for _, l := range t.takeMail() {
		l.started <- fmt.Errorf("server thread %d ended: %w", t.id, errors.Join(t.err, ErrQueueStopped))
	}
	t.waker.Close()
	close(t.done)
}

// threadExitWait bounds finish's wait for the OS thread to exit; the
// runtime ends a thread whose locked goroutine returned at once, so it is
// only reached if that ever changes, and the ring is then closed anyway.
const threadExitWait = 5 * time.Second

// waitTaskExit waits until task tid of this process has exited (its
// /proc/self/task entry is gone: a thread other than the leader is reaped
// as it exits), or for at most wait.
func waitTaskExit(tid int, wait time.Duration) {
	path := "/proc/self/task/" + strconv.Itoa(tid)
	deadline := time.Now().Add(wait)
	for pause := 100 * time.Microsecond; time.Now().Before(deadline); pause = min(2*pause, 10*time.Millisecond) {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(pause)
	}
}
