// A server thread's loop: its ring and tables, one round (reap, dispatch,
// submit), and the handling of each completion.

package dataplane

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

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
	flags, sq, cq, reap := uint32(ringFlags), min(tags+1, threadSQ), 2*tags+2, 0
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
	if reap == 0 {
		// The reap array holds as many CQEs as the CQ ring: the busy
		// queues' backlog (at most one CQE per operation in flight,
		// which the ring is sized for) then never fills it, so a light
		// queue's CQE is reaped at the next look and served first
		// (dispatch). roundBusyCQEs bounds a round's work, not the array.
		reap = int(ring.CQEntries())
	}
	s := &threadLoop{t: t, ab: ab, ring: ring, cqes: make([]uring.CQE, reap), pollMax: t.cfg.PollInFlight,
		slots: make([]*queueState, t.cfg.Queues), bufSlots: newRangeAlloc(t.cfg.Tags)}
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
	// Two slots per queue, and the last for the ring-freed pipe.
	if err := s.ring.RegisterFilesSparse(uint32(2*len(s.slots) + 1)); err != nil {
		return err
	}
	if err := s.registerRingFreed(uint32(2 * len(s.slots))); err != nil {
		return err
	}
	if err := s.ring.RegisterBuffersSparse(uint32(s.t.cfg.Tags)); err != nil {
		return err
	}
	// Entering through a registered ring fd saves an fd lookup per
	// io_uring_enter; kernels without it (< 5.18) just do the lookup.
	_ = s.ring.RegisterRingFD()
	return s.initIOWQ()
}

// threadLoop is the state of one server thread. Only that thread touches
// it. Its many fields (26) are the round's counters, lists and timers,
// read in every round without locks because they live on the one thread.
type threadLoop struct {
	t       *Thread
	ab      Ablation // t.cfg.Ablation: techniques switched off (benchmarks)
	pollMax int      // t.cfg.PollInFlight (0: pollMaxInFlight)
	ring    *uring.Ring
	// ringFreed reads end of file once the kernel has freed the ring
	// (registerRingFreed).
	ringFreed *os.File
	cqes      []uring.CQE
	spare     []uring.CQE // lightFirst's scratch
	// backlog counts the CQEs of busy queues that the last round left
	// unhandled (roundBusyCQEs), kept at the head of cqes for the next.
	backlog  int
	cur      *queueState   // the queue handling a CQE now (dispatch)
	slots    []*queueState // queues by slot (user_data); nil = free
	free     []uint16      // free slots, a stack
	bufSlots rangeAlloc
	iowq     iowqCap
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
	held, commits, tails, ending []*queueState
	// dirty are the queues whose counters changed this round (publish).
	dirty []*queueState
	// admitCap is the most reads and writes the thread keeps in flight
	// on the backing disk (0: no bound), admitted how many it has,
	// admitting the queues whose requests wait for a slot, and admitNext
	// the turn among them (admission_linux.go).
	admitCap, admitted, admitNext int
	admitting                     []*queueState
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

// failWindow names a point of the loop where tests make a thread fail
// (FailThreadAt, testhooks_on_linux.go); the plugin's hooks are empty.
type failWindow int

const (
	atBeforeEnter failWindow = iota
	atInEnter
	atMidDispatch
	atRoundStart
)

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
		runFailHook(s, atRoundStart, 0)
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
		runFailHook(s, atBeforeEnter, 0)
		var err error
		if n, err = s.next(n > 0); err != nil {
			return err
		}
		runFailHook(s, atInEnter, n)
		s.roundAt = monoNow()
		s.dispatch(n)
		if len(s.admitting) > 0 {
			s.admit()
		}
		if len(s.tails) > 0 {
			s.reclaimIdle()
		}
		s.publish()
		s.settle()
	}
}

// publish stores the counters of the queues that changed this round (see
// queueTally). Once per round: Queue.Settled reads a queue's backing count
// as of the end of the round before the thread's latest.
func (s *threadLoop) publish() {
	for _, l := range s.dirty {
		l.publish()
	}
	s.dirty = s.dirty[:0]
}

// dispatch handles the round's CQEs, s.cqes[:n], fairly between the
// thread's devices: first those of light queues (lightFirst), whose SQEs
// then go to the kernel at once, before the busy queues' work; then at most
// roundBusyCQEs of the busy queues', leaving the rest as the backlog that
// the next round handles after one more look at the ring. A round's length
// is then bounded, so a request of a quiet device waits neither behind
// every completion of its busy neighbours nor for the end of their round.
//
// A panic while one queue handles its completion fails that queue (its
// device reports it, its I/O is held) and the thread goes on with the other
// CQEs: a bug reached by one device's requests must not stop every device
// of the thread. A panic outside a queue's handling ends the thread (run).
func (s *threadLoop) dispatch(n int) {
	end, light := n, 0
	if !s.ab.ringOrder() {
		light = s.lightFirst(n)
		end = min(n, light+roundBusyCQEs)
	}
	for i := 0; i < light; {
		i = s.dispatchFrom(i, light)
	}
	if light > 0 && len(s.admitting) > 0 {
		// A light queue's request that waits for a disk slot goes
		// first to one the light completions freed.
		s.admit()
	}
	if light > 0 && end > light && s.ring.Unsubmitted() > 0 {
		// Refused, the SQEs wait for the round's own submission.
		_, _ = s.ring.Submit()
	}
	runFailHook(s, atMidDispatch, n)
	for i := light; i < end; {
		i = s.dispatchFrom(i, end)
	}
	s.backlog = copy(s.cqes, s.cqes[end:n])
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

// roundBusyCQEs is the most CQEs of busy queues a round handles: the bound
// of a round's length, and so of how long a light queue's new request or
// backing completion waits for the thread to look at the ring again. Each
// look costs at most one io_uring_enter, paid for this many CQEs.
const roundBusyCQEs = 32

// lightFirst orders the round's CQEs, s.cqes[:n], so that those of light
// queues (few requests in service: a device at a low queue depth beside
// busy ones) come first, each side in ring order, and returns how
// many are light. CQEs of no queue (the waker's) count as light.
func (s *threadLoop) lightFirst(n int) int {
	if cap(s.spare) < n {
		s.spare = make([]uring.CQE, 0, len(s.cqes))
	}
	heavy := s.spare[:0]
	light := 0
	for i := range n {
		_, slot, _ := decodeUD(s.cqes[i].UserData)
		if l := s.queue(slot); l == nil || l.light() {
			s.cqes[light] = s.cqes[i]
			light++
			continue
		}
		heavy = append(heavy, s.cqes[i])
	}
	copy(s.cqes[light:n], heavy)
	return light
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
	case udCopy:
		err = l.onCopy(tag, c.Res)
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
