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
// tag has been aborted. A thread that fails (a panic, a ring error) ends
// every queue it served with its error, which the devices report
// (Device.Err), and closes its ring, so that devices with user recovery
// are quiesced, their I/O held, not lost; the Server's Health fails while
// they are (health_linux.go).

package dataplane

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
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
	// IOWQWorkers caps the thread's io-wq workers (bounded work: writes
	// io_uring could not issue without blocking, fsync, fallocate); 0
	// keeps the kernel's default.
	IOWQWorkers uint32
	// Ablation switches techniques off for benchmarks (zero: none).
	Ablation Ablation
	// PollInFlight is the most requests the thread may be serving and
	// still poll (Options.Poll) before a sleeping wait; 0 means
	// pollMaxInFlight. A benchmark knob.
	PollInFlight int
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
	// reapBatch is how many CQEs a round takes at most; more wait for
	// the next round, which does not sleep while they are there.
	reapBatch = 1024
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
	mail   []*loop // queues to start serving
	tags   int     // reserved by its queues (QueueCost each)
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
func (t *Thread) start(l *loop) error {
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
func (t *Thread) takeMail() []*loop {
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
func (t *Thread) run(ready chan<- error) {
	runtime.LockOSThread()
	var s *threadLoop
	var err error
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
		if err != nil && !errors.Is(err, ErrQueueStopped) {
			t.err = fmt.Errorf("server thread %d: %w: %w", t.id, ErrThreadDead, err)
		}
		if s != nil {
			s.close(t.err)
		}
		t.closing.Store(true)
		for _, l := range t.takeMail() {
			l.started <- fmt.Errorf("server thread %d ended: %w", t.id, errors.Join(t.err, ErrQueueStopped))
		}
		t.waker.Close()
		select {
		case ready <- t.err: // setup failed or panicked before ready
		default:
		}
		close(t.done)
	}()
	if s, err = t.setup(); err != nil {
		return
	}
	ready <- nil
	err = s.serve()
}

// ringFlags are the server ring's setup flags; the engine drops the ones an
// older kernel refuses (DEFER_TASKRUN first).
const ringFlags = uring.IORING_SETUP_SINGLE_ISSUER | uring.IORING_SETUP_DEFER_TASKRUN |
	uring.IORING_SETUP_COOP_TASKRUN | uring.IORING_SETUP_TASKRUN_FLAG

// setup builds the thread's ring and its empty tables.
func (t *Thread) setup() (*threadLoop, error) {
	home, err := threadSetup(t.cfg.CPU)
	if err != nil {
		return nil, fmt.Errorf("server thread %d: %w", t.id, err)
	}
	tags := uint32(t.cfg.Tags)
	ab := t.cfg.Ablation
	flags, sq, cq, reap := uint32(ringFlags), min(tags+1, threadSQ), 2*tags+2, min(int(2*tags+2), reapBatch)
	if ab.plainRing() {
		flags = 0
	}
	if ab.unbounded() {
		// The kernel wants at least as many CQ entries as SQ entries;
		// the engine's pending queue holds the SQEs beyond.
		sq, cq = unboundedCQ, unboundedCQ
	}
	if ab.reapOne() {
		reap = 1
	}
	ring, err := uring.New(uring.Config{Entries: sq, CQEntries: cq, Unbounded: ab.unbounded(),
		Flags: flags, PendingEntries: int(min(tags+1, threadSQ))})
	if err != nil {
		return nil, fmt.Errorf("server thread %d: create ring: %w", t.id, err)
	}
	s := &threadLoop{t: t, ab: ab, ring: ring, cqes: make([]uring.CQE, reap), pollMax: t.cfg.PollInFlight,
		slots: make([]*loop, t.cfg.Queues), bufSlots: newRangeAlloc(t.cfg.Tags)}
	for i := t.cfg.Queues - 1; i >= 0; i-- {
		s.free = append(s.free, uint16(i))
	}
	if err := s.register(); err != nil {
		ring.Close()
		return nil, fmt.Errorf("server thread %d: %w", t.id, err)
	}
	if ab.threadNice() {
		// Linux keeps the nice value per thread: who 0 is this one.
		// Refused (no CAP_SYS_NICE), the thread runs at the default.
		_ = unix.Setpriority(unix.PRIO_PROCESS, 0, threadNice)
	}
	if !t.cfg.Pin {
		if err := unpin(home); err != nil {
			ring.Close()
			return nil, fmt.Errorf("server thread %d: %w", t.id, err)
		}
	}
	s.armWaker()
	if _, err := ring.Submit(); err != nil {
		ring.Close()
		return nil, fmt.Errorf("server thread %d: arm waker: %w", t.id, err)
	}
	return s, nil
}

func (s *threadLoop) register() error {
	if err := s.ring.RegisterFilesSparse(uint32(2 * len(s.slots))); err != nil {
		return err
	}
	if err := s.ring.RegisterBuffersSparse(uint32(s.t.cfg.Tags)); err != nil {
		return err
	}
	// Entering through a registered ring fd saves an fd lookup per
	// io_uring_enter; kernels without it (< 5.18) just do the lookup.
	_ = s.ring.RegisterRingFD()
	if n := s.t.cfg.IOWQWorkers; n > 0 {
		// io-wq belongs to the thread, so this runs on the thread.
		if _, err := s.ring.SetMaxWorkers(n, 0); err != nil {
			return err
		}
	}
	return nil
}

// threadLoop is the state of one server thread. Only that thread touches it.
type threadLoop struct {
	t        *Thread
	ab       Ablation // t.cfg.Ablation: techniques switched off (benchmarks)
	pollMax  int      // t.cfg.PollInFlight (0: pollMaxInFlight)
	ring     *uring.Ring
	cqes     []uring.CQE
	spare    []uring.CQE // lightFirst's scratch
	cur      *loop       // the queue handling a CQE now (dispatch)
	slots    []*loop     // queues by slot (user_data); nil = free
	free     []uint16    // free slots, a stack
	bufSlots rangeAlloc
	// backing counts backing operations in flight, serving the requests
	// received and not yet committed, batchCmds the PREP/COMMIT
	// commands of batch mode that still owe their CQE, and parked the
	// FETCH and COMMIT_AND_FETCH commands that still owe theirs (each
	// one's CQE is a new request, or its tag's end), over every queue.
	backing, serving, batchCmds, parked int
	fetchers                            int // batch-mode queues with their FETCH armed
	// held are the queues holding requests for their rate limits,
	// commits the batch-mode queues with results to send this round,
	// tails the copy-mode queues whose buffer tails await a reclaim, and
	// ending the queues that may have nothing left to do.
	held, commits, tails, ending []*loop
	// wakeDisarmed: the poll on the thread's eventfd is not in the ring
	// (no SQE was free when its last CQE came), so wakes (mail, Nudge,
	// Close) go unnoticed until armWaker succeeds.
	wakeDisarmed bool
	// round counts the loop's rounds; roundAt is when (monoNow) this one
	// began.
	round   uint64
	roundAt int64
	// gapNs is a moving average of how long the thread waits, after a
	// round, for the next completion; it sizes the poll, at most poll
	// (see next).
	gapNs int64
	poll  time.Duration
	// offeredAt is when (monoNow) the thread last offered itself to the
	// Go scheduler (see next and uring.OfferInterval).
	offeredAt int64
	// reclaimRetryAt is when (monoNow) the idle reclaim may be tried
	// again after the ring was too busy for it.
	reclaimRetryAt int64
}

// serve is the event loop: one io_uring_enter per round submits every ready
// SQE of every queue and waits for completions; every CQE is reaped and
// the head advanced once; each CQE turns into at most one new SQE.
func (s *threadLoop) serve() error {
	n := 0
	for {
		if s.wakeDisarmed {
			s.armWaker()
		}
		if s.t.closing.Load() {
			return ErrQueueStopped
		}
		if s.t.hasMail.Load() {
			for _, l := range s.t.takeMail() {
				l.started <- s.attach(l)
			}
		}
		s.round++
		s.t.stats.rounds.Add(1)
		runRoundHook(s)
		if len(s.held) > 0 {
			s.releaseHeld(monoNow())
		}
		for _, l := range s.commits {
			l.inCommits = false
			if err := l.commitBatch(); err != nil {
				l.fail(err)
			}
		}
		s.commits = s.commits[:0]
		var err error
		if n, err = s.next(n > 0); err != nil {
			return err
		}
		s.roundAt = monoNow()
		s.dispatch(n)
		if len(s.tails) > 0 {
			s.reclaimIdle()
		}
		s.settle()
	}
}

// dispatch handles the round's CQEs, s.cqes[:n]. A panic while one queue
// handles its completion fails that queue (its device reports it, its I/O
// is held) and the thread goes on with the other CQEs: a bug reached by one
// device's requests must not stop every device of the thread. A panic
// outside a queue's handling ends the thread (run).
func (s *threadLoop) dispatch(n int) {
	if s.ab.lightFirst() {
		s.lightFirst(n)
	}
	for i := 0; i < n; {
		i = s.dispatchFrom(i, n)
	}
}

// dispatchFrom handles s.cqes[i:n] and returns n, or the index after the
// CQE whose handling panicked.
func (s *threadLoop) dispatchFrom(i, n int) (next int) {
	defer func() {
		if r := recover(); r != nil {
			l := s.cur
			s.cur = nil
			if l == nil {
				panic(r)
			}
			l.fail(fmt.Errorf("%w: %v", errQueuePanic, r))
			next = i + 1
		}
	}()
	for ; i < n; i++ {
		s.handle(&s.cqes[i])
		if s.ab.submitEach() {
			s.submitEach()
		}
	}
	s.cur = nil
	return n
}

// lightBacking is the most backing operations a queue may have in flight
// and still count as light (Ablation LightFirst).
const lightBacking = 2

// lightFirst orders the round's CQEs, s.cqes[:n], so that those of light
// queues (few backing operations in flight: a device at a low queue depth
// beside busy ones) come first, each side in ring order: their SQEs then
// go first into the submission queue, and the kernel issues them before
// the busy devices' (Ablation LightFirst, a design of fairness measured
// against the default).
func (s *threadLoop) lightFirst(n int) {
	if cap(s.spare) < n {
		s.spare = make([]uring.CQE, 0, len(s.cqes))
	}
	heavy := s.spare[:0]
	light := 0
	for i := range n {
		_, slot, _ := decodeUD(s.cqes[i].UserData)
		if l := s.queue(slot); l == nil || l.backing <= lightBacking {
			s.cqes[light] = s.cqes[i]
			light++
			continue
		}
		heavy = append(heavy, s.cqes[i])
	}
	copy(s.cqes[light:n], heavy)
}

// errQueuePanic is the class of a queue failed by a panic in its handling.
var errQueuePanic = errors.New("panic serving the queue")

// handle dispatches one CQE to its queue by the slot in its user_data.
func (s *threadLoop) handle(c *uring.CQE) {
	kind, slot, tag := decodeUD(c.UserData)
	if kind == udWake {
		s.t.waker.Drain()
		s.armWaker()
		return
	}
	if int(slot) >= len(s.slots) || s.slots[slot] == nil {
		// Not a queue of ours: a stale CQE can only be a bug, and
		// must not take the other queues down; it is counted.
		s.t.stats.stray.Add(1)
		return
	}
	l := s.slots[slot]
	s.cur = l
	var err error
	switch kind {
	case udCmd:
		err = l.onCmd(tag, c.Res)
	case udBacking:
		err = l.onBacking(tag, c.Res)
	case udFetch:
		err = l.onFetch(c)
	default:
		err = fmt.Errorf("cqe with unknown user data %#x", c.UserData)
	}
	if err != nil {
		l.fail(err)
	}
}

// armWaker polls the thread's eventfd again. With no SQE free (the
// submission and pending queues full within a round) it is tried again at
// the start of every round, and waits stay short meanwhile (wakeRetry): a
// wake that found no poll armed leaves the eventfd readable, so the poll
// fires as soon as it is in the ring, and mail, a Nudge or a Close is late,
// never lost.
func (s *threadLoop) armWaker() {
	sqe := s.ring.GetSQE()
	s.wakeDisarmed = sqe == nil
	if sqe != nil {
		s.t.waker.PrepPoll(sqe, encodeUD(udWake, 0, 0))
	}
}

// wakeRetry bounds a sleeping wait while the waker is not armed.
const wakeRetry = time.Millisecond

// pollMaxInFlight is the most requests a thread may be serving and still
// poll: with more, the next completion is never far, a sleeping wait
// gathers them in batches, and polling only takes CPU from the submitters
// (measured: -10 to -30% IOPS with two fio jobs at queue depth 32 on two
// CPUs).
const pollMaxInFlight = 4

// next submits the round's SQEs and returns the next batch of CQEs in
// s.cqes. After a round that did work (busy), with at most pollMaxInFlight
// requests in service, and when completions have lately come within the
// poll window of a round's end, it first polls the ring for twice that
// usual wait, yielding the CPU between checks so that polling never starves
// a runnable task. Otherwise, or when polling found nothing, it sleeps in
// io_uring_enter until a batch of completions. Both paths feed the moving
// average of the wait, so a thread whose completions come slower than the
// window stops polling, and one whose come fast starts.
func (s *threadLoop) next(busy bool) (int, error) {
	poll := int64(s.poll)
	start := monoNow()
	if poll > 0 && busy && s.gapNs <= poll && s.serving <= cmp.Or(s.pollMax, pollMaxInFlight) {
		if _, err := s.ring.Submit(); err != nil {
			return 0, fmt.Errorf("submit: %w", err)
		}
		// Reap enters the kernel only when it flags completions
		// waiting as task work, so the checks cost no system calls.
		until := start + min(poll, 2*s.gapNs)
		for {
			n, err := s.reap()
			if n > 0 || err != nil {
				s.noteGap(start, poll)
				return n, err
			}
			if monoNow() > until || s.t.closing.Load() || s.t.hasMail.Load() {
				break
			}
			yield()
		}
	}
	if uring.OfferDue(time.Duration(start - s.offeredAt)) {
		// The round's I/O goes to the kernel first: the offer hands the
		// P to another thread and back, which must not delay it.
		if _, err := s.ring.Submit(); err != nil {
			return 0, fmt.Errorf("submit: %w", err)
		}
		runtime.Gosched()
		s.offeredAt = monoNow()
	}
	n, err := s.wait(start)
	if poll > 0 && n > 0 {
		s.noteGap(start, poll)
	}
	return n, err
}

// setPollWindow sets the thread's poll window to the longest of its
// queues' (Options.Poll): the thread polls for any of them. It runs when a
// queue comes or goes, not per round.
func (s *threadLoop) setPollWindow() {
	s.poll = 0
	for _, l := range s.slots {
		if l != nil {
			s.poll = max(s.poll, l.cfg.Options.Poll)
		}
	}
}

// wait submits the round's SQEs and sleeps in the same io_uring_enter until
// waitFor completions are ready, until the first held request falls due,
// or until idle buffer tails fall due for reclaim, then reaps them.
func (s *threadLoop) wait(now int64) (int, error) {
	bound := s.heldWait(now)
	if b := s.reclaimWait(now); b > 0 && (bound == 0 || b < bound) {
		bound = b
	}
	if s.wakeDisarmed && (bound == 0 || wakeRetry < bound) {
		bound = wakeRetry
	}
	if s.ab.timedBatch() && (bound == 0 || timedBatchWait < bound) {
		bound = timedBatchWait
	}
	_, err := s.ring.SubmitAndWait(s.waitFor(), bound)
	s.t.stats.enters.Add(1)
	if err != nil && !errors.Is(err, unix.ETIME) {
		return 0, fmt.Errorf("submit and wait: %w", err)
	}
	return s.reap()
}

// unboundedCQ is the ring size with Ablation Unbounded: below what one
// device of two queues at depth 64 keeps parked on a thread of two.
const unboundedCQ = 64

// threadNice is a server thread's nice value under Ablation ThreadNice.
const threadNice = -10

// timedBatchWait bounds a batched wait under Ablation TimedBatch.
const timedBatchWait = 200 * time.Microsecond

// waitFor is how many completions a sleeping wait asks for. While any
// queue of the thread can receive a request (a FETCH or COMMIT_AND_FETCH
// parked, or a batch-mode FETCH armed), one: the CQE of a new request
// stands alone (one CQE for one request, or in batch mode for a whole
// batch), and a wait for more would hold it behind other devices' backing
// I/O, without bound if their backing file stalls. A busy thread still
// serves in batches: what completes while it handles a round is reaped by
// the next one at once. Only when no request can arrive (every tag in
// service) does it wait for a quarter of the backing operations in flight,
// which are sure to complete. Plus the CQEs of the PREP/COMMIT commands
// this wait submits or left unreaped, which come at once.
//
// Ablations BatchWait and TimedBatch restore the quarter of the backing I/O for
// queues of one CQE per request (TimedBatch bounding the wait to
// timedBatchWait), to measure the policy against them.
func (s *threadLoop) waitFor() uint32 {
	want := 1
	news := s.fetchers > 0 || (s.parked > 0 && !s.ab.batchWait() && !s.ab.timedBatch())
	if !news && !s.ab.reapOne() {
		want = max(1, s.backing/4)
	}
	return uint32(want + s.batchCmds)
}

// reap copies the ready CQEs to s.cqes and returns how many there are. It
// first settles the CQEs of batch mode's PREP and COMMIT commands, which
// only give back their element arrays: they are no news (no request came
// or finished), so they neither end a poll nor make a round busy.
func (s *threadLoop) reap() (int, error) {
	n := s.ring.Reap(s.cqes)
	s.t.stats.cqes.Add(uint64(n))
	if s.batchCmds == 0 {
		return n, nil
	}
	news := 0
	for i := range n {
		if kind, slot, elems := decodeUD(s.cqes[i].UserData); kind == udBatch {
			if l := s.queue(slot); l != nil {
				if err := l.onBatchCmd(elems, s.cqes[i].Res); err != nil {
					l.fail(err)
				}
			}
			continue
		}
		s.cqes[news] = s.cqes[i]
		news++
	}
	return news, nil
}

// submitEach submits what one CQE's handling prepared at once (Ablation
// SubmitEach). A refused submission leaves the SQEs for the round's enter.
func (s *threadLoop) submitEach() {
	if s.ring.Unsubmitted() > 0 {
		_, _ = s.ring.Submit()
	}
}

// queue returns the queue in slot, or nil.
func (s *threadLoop) queue(slot uint16) *loop {
	if int(slot) < len(s.slots) {
		return s.slots[slot]
	}
	return nil
}

// noteGap adds the wait since start to the moving average (weight 1/8).
// A sample counts at most twice the poll window: only its relation to the
// window matters, and one idle minute must not keep the thread from
// polling for long after.
func (s *threadLoop) noteGap(start, poll int64) {
	gap := min(monoNow()-start, 2*poll)
	s.gapNs += (gap - s.gapNs) / 8
}

// yield gives the CPU to any other runnable task (sched_yield). It is a
// raw system call: it never blocks, so the P need not be released.
func yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// releaseHeld issues the held requests due at now, queue by queue, and
// forgets the queues that hold nothing more.
func (s *threadLoop) releaseHeld(now int64) {
	for i := 0; i < len(s.held); {
		l := s.held[i]
		if err := l.release(now); err != nil {
			l.fail(err)
		}
		if l.heldLen > 0 && !l.failed {
			i++
			continue
		}
		l.inHeld = false
		s.held[i] = s.held[len(s.held)-1]
		s.held = s.held[:len(s.held)-1]
	}
}

// heldWait bounds a sleeping wait so that the thread wakes when the first
// held request of any queue falls due; 0 means none is held.
func (s *threadLoop) heldWait(now int64) time.Duration {
	return earliest(s.held, now, (*loop).heldWait)
}

// reclaimWait bounds a sleeping wait so that the thread wakes when the
// buffer tails of an idle queue fall due for reclaim, and not before a
// failed attempt may be retried; 0 means no bound.
func (s *threadLoop) reclaimWait(now int64) time.Duration {
	b := earliest(s.tails, now, (*loop).reclaimWait)
	if b > 0 && now+int64(b) < s.reclaimRetryAt {
		b = time.Duration(s.reclaimRetryAt - now)
	}
	return b
}

// reclaimRetry is how long a thread waits to try the idle reclaim again
// after its ring was too busy for it (reclaimIdle).
const reclaimRetry = 100 * time.Millisecond

// earliest is the shortest of the queues' bounds at now (0 from a queue:
// none), or 0.
func earliest(qs []*loop, now int64, bound func(*loop, int64) time.Duration) time.Duration {
	var first time.Duration
	for _, l := range qs {
		if b := bound(l, now); b > 0 && (first == 0 || b < first) {
			first = b
		}
	}
	return first
}

// reclaimIdle gives back the buffer tails of the queues idle long enough.
// Only once every SQE is in the kernel and no CQE waits: in copy mode the
// kernel copies a READ's data out of its buffer while it consumes the
// COMMIT, and a new WRITE's data into its buffer in the task work that
// also posts its CQE, so with both queues empty no copy can meet the
// madvise (DEFER_TASKRUN runs task work only inside this thread's waits).
func (s *threadLoop) reclaimIdle() {
	now := monoNow()
	if now < s.reclaimRetryAt {
		return
	}
	due := false
	for _, l := range s.tails {
		due = due || l.reclaimDue(now)
	}
	if !due {
		return
	}
	if _, err := s.ring.Submit(); err != nil || s.ring.Unsubmitted() > 0 || s.ring.Ready() > 0 {
		// Other queues keep the ring busy: try again a little later,
		// not every round (an attempt costs a system call, and the
		// due tails would bound every wait to a millisecond).
		s.reclaimRetryAt = now + int64(reclaimRetry)
		return
	}
	for i := 0; i < len(s.tails); {
		l := s.tails[i]
		if l.reclaimDue(now) {
			l.reclaim()
		}
		if l.tailsUsed {
			i++
			continue
		}
		l.inTails = false
		s.tails[i] = s.tails[len(s.tails)-1]
		s.tails = s.tails[:len(s.tails)-1]
	}
}

// settle finishes the queues that have nothing left to do.
func (s *threadLoop) settle() {
	for i := 0; i < len(s.ending); {
		l := s.ending[i]
		if !l.done() {
			i++
			continue
		}
		s.ending[i] = s.ending[len(s.ending)-1]
		s.ending = s.ending[:len(s.ending)-1]
		s.detach(l, l.cmdErr)
	}
}

// attach sets up a queue on the thread: two fixed-file slots, a run of
// buffer slots (registered heads in copy mode), batch mode's fetch ring,
// and the FETCH of every tag, submitted before it returns so that
// START_DEV (or END_USER_RECOVERY) finds every tag fetched.
func (s *threadLoop) attach(l *loop) error {
	if len(s.free) == 0 {
		return fmt.Errorf("server thread %d: no free queue slot: %w", s.t.id, ErrThreadFull)
	}
	base, ok := s.bufSlots.alloc(int(l.cfg.Depth))
	if !ok {
		return fmt.Errorf("server thread %d: no run of %d buffer slots: %w", s.t.id, l.cfg.Depth, ErrThreadFull)
	}
	slot := s.free[len(s.free)-1]
	l.s, l.ring, l.slot, l.bufBase = s, s.ring, slot, uint16(base)
	l.fileChar, l.fileBacking, l.fileFlag = int32(2*slot), int32(2*slot+1), uring.IOSQE_FIXED_FILE
	if s.ab.noFixedFiles() {
		l.fileChar, l.fileBacking, l.fileFlag = int32(l.cfg.CharFD), int32(l.cfg.Target.FD), 0
	}
	if err := l.setup(); err != nil {
		l.teardown()
		s.bufSlots.free(base, int(l.cfg.Depth))
		return err
	}
	s.free = s.free[:len(s.free)-1]
	s.slots[slot] = l
	l.attached = true
	s.setPollWindow()
	if err := l.fetchAll(); err != nil {
		// The FETCHes that went in complete with the ring; the queue
		// cannot serve without the others.
		l.fail(err)
		return err
	}
	if _, err := s.ring.Submit(); err != nil {
		l.fail(err)
		return fmt.Errorf("submit fetches: %w", err)
	}
	return nil
}

// detach ends a queue that has nothing in flight: its slots are cleared,
// its memory unmapped, and Wait returns err.
func (s *threadLoop) detach(l *loop, err error) {
	// Off every list of the thread first: a list that kept it would
	// touch its unmapped buffers (seen: the idle reclaim of a detached
	// copy-mode queue).
	for _, list := range []*[]*loop{&s.held, &s.commits, &s.tails, &s.ending} {
		*list = slices.DeleteFunc(*list, func(q *loop) bool { return q == l })
	}
	l.inHeld, l.inCommits, l.inTails, l.inEnding = false, false, false, false
	l.teardown()
	s.bufSlots.free(int(l.bufBase), int(l.cfg.Depth))
	s.slots[l.slot] = nil
	s.free = append(s.free, l.slot)
	s.setPollWindow()
	l.end(err)
}

// close ends the thread's ring and every queue it serves: closing the ring
// cancels their parked commands (devices with user recovery stay
// QUIESCED) and ends the kernel's use of their descriptors and buffers,
// which are unmapped after it.
func (s *threadLoop) close(err error) {
	s.ring.Close()
	if err == nil {
		err = ErrQueueStopped
	}
	for _, l := range s.slots {
		if l != nil {
			l.ring = nil // closed: teardown clears nothing on it
			l.teardown()
			l.end(err)
		}
	}
}

// rangeAlloc hands out runs of consecutive slots of a table of n, first
// fit, and merges runs given back.
type rangeAlloc struct {
	runs [][2]int // free runs {start, length}, sorted by start
}

func newRangeAlloc(n int) rangeAlloc { return rangeAlloc{runs: [][2]int{{0, n}}} }

// alloc returns the start of a free run of n slots.
func (a *rangeAlloc) alloc(n int) (int, bool) {
	for i, r := range a.runs {
		if r[1] < n {
			continue
		}
		if r[1] == n {
			a.runs = append(a.runs[:i], a.runs[i+1:]...)
		} else {
			a.runs[i] = [2]int{r[0] + n, r[1] - n}
		}
		return r[0], true
	}
	return 0, false
}

// free gives back the run of n slots at start.
func (a *rangeAlloc) free(start, n int) {
	i := 0
	for i < len(a.runs) && a.runs[i][0] < start {
		i++
	}
	a.runs = append(a.runs, [2]int{})
	copy(a.runs[i+1:], a.runs[i:])
	a.runs[i] = [2]int{start, n}
	// Merge with the next run, then with the previous one.
	if i+1 < len(a.runs) && start+n == a.runs[i+1][0] {
		a.runs[i][1] += a.runs[i+1][1]
		a.runs = append(a.runs[:i+1], a.runs[i+2:]...)
	}
	if i > 0 && a.runs[i-1][0]+a.runs[i-1][1] == start {
		a.runs[i-1][1] += a.runs[i][1]
		a.runs = append(a.runs[:i], a.runs[i+1:]...)
	}
}
