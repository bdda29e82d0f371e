// When a server thread polls, sleeps and wakes: the wait for the next
// completion, and the timers of held requests and idle buffer reclaim.

package dataplane

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// wakeRetry bounds a sleeping wait while the waker is not armed.
const wakeRetry = time.Millisecond

// pollMaxInFlight is the most requests a thread may be serving and still
// poll: with more, the next completion is never far, a sleeping wait
// gathers them in batches, and polling only takes CPU from the submitters
// (it lost IOPS with two fio jobs at queue depth 32 on two CPUs;
// docs/benchmark-studies.md, "Figures behind code comments").
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
	if s.backlog > 0 {
		return s.nextBacklog()
	}
	poll := int64(s.poll)
	start := monoNow()
	if poll > 0 && busy && s.gapNs <= poll && s.serving <= cmp.Or(s.pollMax, pollMaxInFlight) && s.t.cfg.Pollers.take() {
		n, err := s.pollRing(start, poll)
		s.t.cfg.Pollers.give()
		if n > 0 || err != nil {
			return n, err
		}
	}
	if err := s.offer(start); err != nil {
		return 0, err
	}
	n, err := s.wait(start)
	if poll > 0 && n > 0 {
		s.noteGap(start, poll)
	}
	return n, err
}

// pollRing submits the round's SQEs and polls the ring for the next batch of
// CQEs for twice the thread's usual wait, at most for the poll window,
// yielding the CPU between checks; it returns 0 if none came.
func (s *threadLoop) pollRing(start, window int64) (int, error) {
	if _, err := s.ring.Submit(); err != nil {
		return 0, fmt.Errorf("submit: %w", err)
	}
	// Reap enters the kernel only when it flags completions waiting as
	// task work, so the checks cost no system calls.
	until := start + min(window, 2*s.gapNs)
	for {
		n, err := s.reap()
		if n > 0 || err != nil {
			s.noteGap(start, window)
			return n, err
		}
		if monoNow() > until || s.t.closing.Load() || s.t.hasMail.Load() {
			return 0, nil
		}
		yield()
	}
}

// nextBacklog submits the round's SQEs and adds what the ring holds now to
// the last round's backlog, without waiting: the same enter runs the task
// work that posts new requests' CQEs, so that the next round sees them
// before it goes on with the backlog.
func (s *threadLoop) nextBacklog() (int, error) {
	if err := s.offer(monoNow()); err != nil {
		return 0, err
	}
	if _, err := s.ring.Submit(); err != nil {
		return 0, fmt.Errorf("submit: %w", err)
	}
	s.t.stats.enters.Add(1)
	n, err := s.reapInto(s.backlog)
	return s.backlog + n, err
}

// offer offers the thread to the Go scheduler when an offer is due
// (uring.OfferInterval since the last), so that the runtime does not take
// its P away in the middle of a wait. A thread that never sleeps, its
// rounds leaving a backlog, offers too.
func (s *threadLoop) offer(now int64) error {
	if s.ab.noOffer() || !uring.OfferDue(time.Duration(now-s.offeredAt)) {
		return nil
	}
	// The round's I/O goes to the kernel first: the offer hands the P to
	// another thread and back, which must not delay it.
	if _, err := s.ring.Submit(); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	runtime.Gosched()
	s.offeredAt = monoNow()
	return nil
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
	want := s.waitFor()
	if want > uint32(1+s.batchCmds) && (bound == 0 || batchWaitMax < bound) {
		bound = batchWaitMax
	}
	_, err := s.ring.SubmitAndWait(want, bound)
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

// batchWaitMax bounds a wait for more than one completion (waitFor): the
// backing operations it counts belong to every device of the thread, and
// one whose backing file stalls must not hold its neighbours' finished
// requests for longer than this. A local disk answers well within it, so
// the batch still saves the wake-ups it is for.
const batchWaitMax = time.Millisecond

// waitFor is how many completions a sleeping wait asks for. While any
// queue of the thread can receive a request (a FETCH or COMMIT_AND_FETCH
// parked, or a batch-mode FETCH armed), one: the CQE of a new request
// stands alone (one CQE for one request, or in batch mode for a whole
// batch), and a wait for more would hold it behind other devices' backing
// I/O, without bound if their backing file stalls. A busy thread still
// serves in batches: what completes while it handles a round is reaped by
// the next one at once. Only when no request can arrive (every tag in
// service) does it wait for a quarter of the backing operations in flight,
// which are sure to complete, and then for at most batchWaitMax. Plus the CQEs of the PREP/COMMIT commands
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
func (s *threadLoop) reap() (int, error) { return s.reapInto(0) }

// reapInto is reap into s.cqes[from:]; it returns how many it added.
func (s *threadLoop) reapInto(from int) (int, error) {
	cqes := s.cqes[from:]
	n := s.ring.Reap(cqes)
	s.t.stats.cqes.Add(uint64(n))
	if s.batchCmds == 0 {
		return n, nil
	}
	news := 0
	for i := range n {
		if kind, slot, elems := decodeUD(cqes[i].UserData); kind == udBatch {
			if l := s.queue(slot); l != nil {
				if err := l.onBatchCmd(elems, cqes[i].Res); err != nil {
					l.fail(err)
				}
			}
			continue
		}
		cqes[news] = cqes[i]
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
func (s *threadLoop) queue(slot uint16) *queueState {
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
	return earliest(s.held, now, (*queueState).heldWait)
}

// reclaimWait bounds a sleeping wait so that the thread wakes when the
// buffer tails of an idle queue fall due for reclaim, and not before a
// failed attempt may be retried; 0 means no bound.
func (s *threadLoop) reclaimWait(now int64) time.Duration {
	b := earliest(s.tails, now, (*queueState).reclaimWait)
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
func earliest(qs []*queueState, now int64, bound func(*queueState, int64) time.Duration) time.Duration {
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
	if _, err := s.ring.Submit(); err != nil || s.ring.Unsubmitted() > 0 || s.ring.Ready() > 0 || s.backlog > 0 {
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
