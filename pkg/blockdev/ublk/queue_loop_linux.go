package ublk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// Registered-file indexes in every queue ring.
const (
	fileChar    = 0 // /dev/ublkcN
	fileBacking = 1 // the target's backing file
)

// maxEAGAIN bounds how often one backing operation is retried on -EAGAIN
// before the request fails with -EIO.
const maxEAGAIN = 64

// epoch is the origin of the queue's monotonic request timestamps.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// tagState is what the queue thread knows about one tag.
type tagState struct {
	req     request
	plan    plan
	done    uint32 // bytes of req served so far (short reads/writes)
	start   int64  // monoNow at arrival, for the latency histogram
	due     int64  // monoNow at which a rate-limited request may start
	retries uint8  // -EAGAIN retries of the current backing op
	aborted bool   // the kernel said -ENODEV: never re-fetch
}

// loop is the state of one queue thread. Only that thread touches it.
type loop struct {
	q       *Queue
	cfg     *QueueConfig
	ring    *uring.Ring
	descs   *descArea
	bufs    *bufArea // nil in zero-copy mode
	b       *batch   // nil unless UBLK_F_BATCH_IO (queue_batch_linux.go)
	zc      bool     // AUTO_BUF_REG: request pages are fixed buffer #tag
	fixed   uint32   // copy mode: bytes at the head of each tag buffer registered as fixed
	tags    []tagState
	cqes    []uring.CQE
	home    *unix.CPUSet // CPU mask to restore once set up (nil: stay)
	aborted int          // tags that got -ENODEV
	backing int          // backing operations in flight
	// mtimeChecked says that this round has looked at the clock for the
	// backing file's mtime, mtimeRecheck that it has been told to look
	// again after a refusal, and mtimeTick is the coarse clock's tick (ns)
	// of the device's last mtime update (freshenMtime).
	mtimeChecked, mtimeRecheck bool
	mtimeTick                  *atomic.Int64
	// roundAt is when (monoNow) this round began; until nowaitOffUntil,
	// writes skip RWF_NOWAIT (nowaitPause).
	roundAt, nowaitOffUntil int64
	// gapNs is a moving average of how long the thread waits, after a
	// round, for the next completion; it sizes the poll (see next).
	gapNs int64
	// offeredAt is when (monoNow) the thread last offered itself to the
	// Go scheduler (see next and uring.OfferInterval).
	offeredAt int64
	// tailsUsed says that some request reached past the registered head
	// of its buffer since the last reclaim; tailsAt is when (monoNow) the
	// last one arrived (see queue_reclaim_linux.go).
	tailsUsed bool
	tailsAt   int64
	cmdErr    error
	// held are the tags whose requests wait for their booked start, a
	// ring of heldLen from heldHead in booking order; limGen is the
	// limits' generation they were booked under (queue_qos_linux.go).
	held              []uint16
	heldHead, heldLen int
	limGen            uint64
}

// ringFlags are the queue ring's setup flags; the engine drops the ones an
// older kernel refuses (DEFER_TASKRUN first).
const ringFlags = uring.IORING_SETUP_SINGLE_ISSUER | uring.IORING_SETUP_DEFER_TASKRUN |
	uring.IORING_SETUP_COOP_TASKRUN | uring.IORING_SETUP_TASKRUN_FLAG

// setup builds everything the loop needs, in the order the kernel wants:
// thread state, ring, registered files, descriptors, buffers.
func (q *Queue) setup() (*loop, error) {
	cfg := &q.cfg
	home, err := threadSetup(cfg.CPU)
	if err != nil {
		return nil, err
	}
	d := uint32(cfg.Depth)
	ring, err := uring.New(uring.Config{Entries: d + 1, CQEntries: 2*d + 2, Flags: ringFlags})
	if err != nil {
		return nil, fmt.Errorf("create ring: %w", err)
	}
	l := &loop{q: q, cfg: cfg, ring: ring, zc: cfg.Flags&FlagAutoBufReg != 0,
		tags: make([]tagState, cfg.Depth), cqes: make([]uring.CQE, 2*d+2), mtimeTick: cfg.MtimeTick}
	if l.mtimeTick == nil {
		l.mtimeTick = new(atomic.Int64)
	}
	if cfg.Limiter != nil {
		l.held = make([]uint16, cfg.Depth)
		l.limGen = cfg.Limiter.Gen()
	}
	if !cfg.PinCPU {
		l.home = home
	}
	if err := l.register(); err != nil {
		l.close()
		return nil, err
	}
	if l.descs, err = mapDescs(cfg.CharFD, cfg.QID, cfg.Depth); err != nil {
		l.close()
		return nil, err
	}
	if !l.zc {
		if l.bufs, err = mapBuffers(cfg.Depth, cfg.MaxIOBytes); err != nil {
			l.close()
			return nil, err
		}
		if err := l.registerBuffers(); err != nil {
			l.close()
			return nil, err
		}
	}
	if cfg.Flags&FlagBatchIO != 0 {
		if err := l.setupBatch(); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

func (l *loop) register() error {
	files := []int32{int32(l.cfg.CharFD)}
	if l.cfg.Target.Kind == TargetFile {
		files = append(files, int32(l.cfg.Target.FD))
	}
	if err := l.ring.RegisterFiles(files); err != nil {
		return fmt.Errorf("register files: %w", err)
	}
	// Entering through a registered ring fd saves an fd lookup per
	// io_uring_enter; kernels without it (< 5.18) just do the lookup.
	_ = l.ring.RegisterRingFD()
	if n := l.cfg.Options.IOWQWorkers; n > 0 {
		// io-wq belongs to the thread, so this runs on the queue thread.
		if _, err := l.ring.SetMaxWorkers(n, 0); err != nil {
			return err
		}
	}
	if l.zc {
		if err := l.ring.RegisterBuffersSparse(uint32(l.cfg.Depth)); err != nil {
			return fmt.Errorf("register sparse buffer table: %w", err)
		}
	}
	return nil
}

// FixedHeadBytes is how much of each copy-mode tag buffer is registered as
// a fixed buffer: enough for the 4-16 KiB requests of random I/O and
// database pages, while the pinned memory stays 1/8 of the default 128 KiB
// buffers (64 idle volumes of 2 queues × 64 tags pin 128 MiB, not 1 GiB).
const FixedHeadBytes = 16 << 10

// registerBuffers registers the head of each copy-mode buffer as a fixed
// buffer when the config asks for it, so backing I/O that fits there skips
// pinning user pages on every request. Registering pins (and so makes
// resident) those heads at once.
func (l *loop) registerBuffers() error {
	if !l.cfg.Options.FixedBuffers {
		return nil
	}
	head := min(uint32(FixedHeadBytes), uint32(l.bufs.size))
	slots := make([][]byte, l.cfg.Depth)
	for i := range slots {
		slots[i] = l.bufs.slice(uint16(i))[:head]
	}
	if err := l.ring.RegisterBuffers(slots); err != nil {
		return fmt.Errorf("register i/o buffers: %w", err)
	}
	l.fixed = head
	return nil
}

// close releases the loop's resources, ring first: closing it cancels the
// parked uring_cmds (the kernel then quiesces or stops the device) and ends
// the kernel's use of descriptors and buffers.
func (l *loop) close() {
	if l.ring != nil {
		l.ring.Close()
	}
	l.b.close()
	l.descs.close()
	l.bufs.close()
}

// fetchAll arms the waker and FETCHes every tag (in batch mode: PREPs
// every tag and arms the FETCH), in one submission.
func (l *loop) fetchAll() error {
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errors.New("no sqe for the waker")
	}
	l.q.waker.PrepPoll(sqe, encodeUD(udWake, 0))
	if l.b != nil {
		if err := l.prepAll(); err != nil {
			return err
		}
	} else {
		for tag := range l.tags {
			if err := l.prepCmd(ioFetchReq, uint16(tag), 0); err != nil {
				return err
			}
		}
	}
	if _, err := l.ring.Submit(); err != nil {
		return fmt.Errorf("submit fetches: %w", err)
	}
	return nil
}

// prepCmd queues a FETCH_REQ or COMMIT_AND_FETCH_REQ for tag.
func (l *loop) prepCmd(op uint32, tag uint16, result int32) error {
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	sqe.PrepURingCmd(fileChar, op)
	sqe.Flags |= uring.IOSQE_FIXED_FILE
	sqe.UserData = encodeUD(udCmd, tag)
	if l.zc {
		// AUTO_BUF_REG: sqe->addr is struct ublk_auto_buf_reg (index =
		// tag, no flags); the command's own addr must stay 0.
		sqe.Addr = uint64(tag)
		putIOCmd(sqe.Cmd(), l.cfg.QID, tag, result, 0)
		return nil
	}
	putIOCmd(sqe.Cmd(), l.cfg.QID, tag, result, l.bufs.addr(tag, 0))
	return nil
}

// putIOCmd writes struct ublksrv_io_cmd into an SQE's 16-byte cmd area.
func putIOCmd(c *[16]byte, qid, tag uint16, result int32, addr uint64) {
	binary.LittleEndian.PutUint16(c[0:], qid)
	binary.LittleEndian.PutUint16(c[2:], tag)
	binary.LittleEndian.PutUint32(c[4:], uint32(result))
	binary.LittleEndian.PutUint64(c[8:], addr)
}

// serve is the event loop: one io_uring_enter per batch submits every ready
// SQE and waits for completions; every CQE is reaped and the head advanced
// once; each CQE turns into at most one new SQE.
func (l *loop) serve() error {
	n := 0
	for {
		if l.q.stopping.Load() {
			return ErrQueueStopped
		}
		if l.done() {
			return l.cmdErr
		}
		if l.heldLen > 0 {
			if err := l.release(monoNow()); err != nil {
				return err
			}
		}
		if err := l.commitBatch(); err != nil {
			return err
		}
		var err error
		if n, err = l.next(n > 0); err != nil {
			return err
		}
		if l.cfg.Options.NowaitWrites {
			l.roundAt = monoNow()
			l.mtimeChecked, l.mtimeRecheck = false, false
		}
		for i := range n {
			if err := l.handle(&l.cqes[i]); err != nil {
				return err
			}
		}
	}
}

// done reports whether the device has ended the queue: every tag aborted
// (in batch mode: the FETCH) and nothing left in service.
func (l *loop) done() bool {
	if l.b != nil {
		return l.batchDone()
	}
	return l.aborted == len(l.tags) && l.backing == 0
}

// pollMaxInFlight is the most requests a queue may be serving and still
// poll: with more, the next completion is never far, a sleeping wait
// gathers them in batches, and polling only takes CPU from the submitters
// (measured: -10 to -30% IOPS with two fio jobs at queue depth 32 on two
// CPUs).
const pollMaxInFlight = 4

// next submits the round's SQEs and returns the next batch of CQEs in
// l.cqes. After a round that did work (busy), with at most pollMaxInFlight
// requests in service, and when completions have lately come within
// Options.Poll of a round's end, it first polls the rings for twice that
// usual wait (at most Poll), yielding the CPU between checks so that
// polling never starves a runnable task. Otherwise, or when polling found
// nothing, it sleeps in io_uring_enter until a batch of completions. Both
// paths feed the moving average of the wait, so a queue whose completions
// come slower than Poll stops polling, and one whose come fast starts.
func (l *loop) next(busy bool) (int, error) {
	poll := int64(l.cfg.Options.Poll)
	start := monoNow()
	if poll > 0 && busy && l.gapNs <= poll && l.q.stats.inFlight.Load() <= pollMaxInFlight {
		if _, err := l.ring.Submit(); err != nil {
			return 0, fmt.Errorf("submit: %w", err)
		}
		// Reap enters the kernel only when it flags completions
		// waiting as task work, so the checks cost no system calls.
		until := start + min(poll, 2*l.gapNs)
		for {
			n, err := l.reap()
			if n > 0 || err != nil {
				l.noteGap(start)
				return n, err
			}
			if monoNow() > until || l.q.stopping.Load() {
				break
			}
			yield()
		}
	}
	if uring.OfferDue(time.Duration(start - l.offeredAt)) {
		// The round's I/O goes to the kernel first: the offer hands the
		// P to another thread and back, which must not delay it.
		if _, err := l.ring.Submit(); err != nil {
			return 0, fmt.Errorf("submit: %w", err)
		}
		runtime.Gosched()
		l.offeredAt = monoNow()
	}
	n, err := l.wait(start)
	if poll > 0 && n > 0 {
		l.noteGap(start)
	}
	if n == 0 && err == nil {
		if now := monoNow(); l.reclaimDue(now) {
			l.reclaim()
		}
	}
	return n, err
}

// wait submits the round's SQEs and sleeps in the same io_uring_enter until
// waitFor(backing) completions are ready, until the first held request
// falls due, or until idle buffer tails fall due for reclaim, then reaps
// them. (Held requests are in flight, so the last two never coincide.)
func (l *loop) wait(now int64) (int, error) {
	bound := l.heldWait(now)
	if bound == 0 {
		bound = l.reclaimWait(now)
	}
	want := waitFor(l.backing)
	if l.b != nil {
		want = l.batchWaitFor()
	}
	_, err := l.ring.SubmitAndWait(want, bound)
	l.q.stats.enters.Add(1)
	if err != nil && !errors.Is(err, unix.ETIME) {
		return 0, fmt.Errorf("submit and wait: %w", err)
	}
	return l.reap()
}

// reap copies the ready CQEs to l.cqes and returns how many there are. In
// batch mode it first settles the CQEs of PREP and COMMIT commands, which
// only give back their element arrays: they are no news (no request came
// or finished), so they neither end a poll nor make a round busy.
func (l *loop) reap() (int, error) {
	n := l.ring.Reap(l.cqes)
	if l.b == nil {
		return n, nil
	}
	news := 0
	for i := range n {
		if kind, slot := decodeUD(l.cqes[i].UserData); kind == udBatch {
			if err := l.onBatchCmd(slot, l.cqes[i].Res); err != nil {
				return 0, err
			}
			continue
		}
		l.cqes[news] = l.cqes[i]
		news++
	}
	return news, nil
}

// waitFor is how many completions a sleeping wait asks for with backing
// operations in flight: a quarter of them, at least one. Backing I/O is
// sure to complete, while parked FETCHes complete only when requests
// arrive, so the wait never hangs; a busy queue wakes once per batch.
// (Batch mode: batchWaitFor.)
func waitFor(backing int) uint32 { return uint32(max(1, backing/4)) }

// noteGap adds the wait since start to the moving average (weight 1/8).
// A sample counts at most 2 × Poll: only its relation to Poll matters, and
// one idle minute must not keep the queue from polling for long after.
func (l *loop) noteGap(start int64) {
	gap := min(monoNow()-start, 2*int64(l.cfg.Options.Poll))
	l.gapNs += (gap - l.gapNs) / 8
}

// yield gives the CPU to any other runnable task (sched_yield). It is a
// raw system call: it never blocks, so the P need not be released.
func yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// handle dispatches one CQE by the kind in its user_data.
func (l *loop) handle(c *uring.CQE) error {
	kind, tag := decodeUD(c.UserData)
	switch kind {
	case udCmd:
		return l.onCmd(tag, c.Res)
	case udBacking:
		return l.onBacking(tag, c.Res)
	case udFetch:
		return l.onFetch(c)
	case udWake:
		l.q.waker.Drain()
		if l.q.stopping.Load() {
			return ErrQueueStopped
		}
		sqe := l.ring.GetSQE()
		if sqe == nil {
			return errors.New("no sqe for the waker")
		}
		l.q.waker.PrepPoll(sqe, encodeUD(udWake, 0))
		return nil
	}
	return fmt.Errorf("cqe with unknown user data %#x", c.UserData)
}
