package dataplane

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// MaxEAGAIN bounds how often one backing operation is retried on -EAGAIN
// before the request fails with -EIO.
const MaxEAGAIN = 64

// epoch is the origin of the queue's monotonic request timestamps.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// tagState is what the queue's thread knows about one tag.
type tagState struct {
	req     request
	plan    plan
	done    uint32 // bytes of req served so far (short reads/writes)
	start   int64  // monoNow at arrival, for the latency histogram
	due     int64  // monoNow at which a rate-limited request may start
	reg     uint32 // copy mode: bytes at the head of the tag's buffer registered (registerHead)
	retries uint8  // -EAGAIN retries of the current backing op
	aborted bool   // the kernel said -ENODEV: never re-fetch
	// admitted: the request holds one of its thread's disk slots
	// (admission_linux.go) until it is committed.
	admitted bool
	// USER_COPY (queue_copy_linux.go): copied says the request's data
	// has crossed between the request and the tag's buffer; link counts
	// the CQEs a linked copy and backing operation still owe, copyRes
	// and linkRes hold their results until both came.
	copied           bool
	link             uint8
	copyRes, linkRes int32
	// run and runLen are the chunks of the queue's pool lent to the
	// request (runLen 0: none; queue_pool_linux.go).
	run, runLen int32
}

// queueState is the serving state of one queue on its server thread. Only
// that thread touches it once the queue is attached. It has many fields
// (36) on purpose: the thread reaches all of a queue's state through one
// pointer per completion, with no locks; the fields are grouped by
// concern, and each concern's code lives in its own file (queue_*.go).
type queueState struct {
	q     *Queue
	cfg   *QueueConfig
	s     *threadLoop // the thread serving the queue (set by attach)
	ring  *uring.Ring // the thread's ring; nil once it is closed
	descs *descArea
	bufs  *bufArea // nil in zero-copy mode
	pool  *bufPool // USER_COPY: memory for the requests larger than the tag buffers
	b     *batch   // nil unless UBLK_F_BATCH_IO (queue_batch_linux.go)
	zc    bool     // AUTO_BUF_REG: request pages are fixed buffer #bufBase+tag
	uc    bool     // USER_COPY: the server copies the data through /dev/ublkcN
	fixed uint32   // copy mode: most bytes at the head of each tag buffer registered as fixed
	tags  []tagState
	// slot is the queue's number on its thread (in every user_data);
	// fileChar and fileBacking are its fixed-file slots, and bufBase
	// the first of its buffer slots, one per tag.
	slot                  uint16
	fileChar, fileBacking int32
	// fileFlag is IOSQE_FIXED_FILE, or 0 where the ablation
	// NoFixedFiles names the files by their fds.
	fileFlag uint8
	bufBase  uint16
	// started answers StartQueue: nil once every tag is FETCHed.
	started chan error
	// attached: the thread took the queue and ends it (Queue.done).
	attached bool
	// failed: the queue stopped serving after cmdErr; it only finishes
	// what is in flight.
	failed  bool
	aborted int // tags that got -ENODEV
	backing int // backing operations in flight
	// tally are the per-request counters as the thread keeps them, and
	// shown what publish last stored of them in q.stats; dirty: the
	// queue is on the thread's list to publish at the round's end.
	tally, shown queueTally
	dirty        bool
	// mtimeRound is the thread's round in which the queue last looked at
	// the clock for the backing file's mtime, recheckRound the round in
	// which a refusal made it look again, and mtime updates it
	// (freshenMtime; nil without NowaitWrites); ownMtime: the queue's
	// own, not its device's, ended with it.
	mtimeRound, recheckRound uint64
	mtime                    *MtimeToucher
	ownMtime                 bool
	// nowaitOffUntil: until then, writes skip RWF_NOWAIT (nowaitPause).
	nowaitOffUntil int64
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
	// waiting are the tags whose reads and writes wait for a disk slot
	// of the thread, a ring of waitLen from waitHead in arrival order
	// (admission_linux.go); made at the first wait.
	waiting           []uint16
	waitHead, waitLen int
	// The thread's lists the queue is on (threadLoop).
	inHeld, inCommits, inTails, inEnding, inAdmitting bool
}

// newLoop returns the serving state of q, before its thread takes it.
func newQueueState(q *Queue) *queueState {
	cfg := &q.cfg
	l := &queueState{q: q, cfg: cfg, zc: cfg.Flags&uapi.FlagAutoBufReg != 0, tags: make([]tagState, cfg.Depth),
		uc:      cfg.Flags&(uapi.FlagAutoBufReg|uapi.FlagUserCopy) == uapi.FlagUserCopy,
		started: make(chan error, 1), mtime: cfg.Mtime}
	if l.mtime == nil && cfg.Options.NowaitWrites && cfg.Target.Kind == TargetFile {
		l.mtime, l.ownMtime = NewMtimeToucher(cfg.Target.FD), true
	}
	if cfg.Limiter != nil || cfg.Gate != nil {
		l.held = make([]uint16, cfg.Depth)
		l.limGen = l.gen()
	}
	return l
}

// setup registers the queue's files and buffers in its thread's ring
// tables and sets up batch mode.
func (l *queueState) setup() error {
	files := []int32{int32(l.cfg.CharFD), -1}
	if l.cfg.Target.Kind == TargetFile {
		files[1] = int32(l.cfg.Target.FD)
	}
	if l.fileFlag != 0 {
		if err := l.ring.UpdateFiles(uint32(l.fileChar), files); err != nil {
			return fmt.Errorf("register files: %w", err)
		}
	}
	if !l.zc {
		if err := l.registerBuffers(); err != nil {
			return err
		}
	}
	if l.cfg.Flags&uapi.FlagBatchIO != 0 {
		if err := l.setupBatch(); err != nil {
			return err
		}
	}
	return nil
}

// FixedHeadBytes is the most of each copy-mode tag buffer registered as a
// fixed buffer: enough for the 4-16 KiB requests of random I/O and
// database pages, while the pinned memory stays 1/8 of the default 128 KiB
// buffers.
const FixedHeadBytes = 16 << 10

// registerBuffers sets how much of the head of each copy-mode buffer may be
// registered as a fixed buffer when the config asks for it, so backing I/O
// that fits there skips pinning user pages on every request. Registering
// pins (and so makes resident) what it registers, so it happens per tag as
// requests need it (registerHead), not here: a volume that only ever does 4
// KiB I/O pins 4 KiB per tag, not the whole head (64 volumes of 2 queues x
// 64 tags: 32 MiB, not 128 MiB).
func (l *queueState) registerBuffers() error {
	if !l.cfg.Options.FixedBuffers || l.s.ab.noFixedBuffers() {
		return nil
	}
	l.fixed = min(uint32(FixedHeadBytes), uint32(l.bufs.size))
	return nil
}

// registerHead makes sure the first end bytes (at most l.fixed) of tag's
// buffer are registered as the tag's fixed buffer, growing the registration
// to whole pages as the requests ask. The tag's earlier backing I/O has
// completed, so replacing its slot meets nothing in flight. If the kernel
// refuses (the locked-memory limit), the queue stops registering and its
// I/O pins pages per request, as without fixed buffers.
func (l *queueState) registerHead(tag uint16, end uint32) bool {
	t := &l.tags[tag]
	if end <= t.reg {
		return true
	}
	want := min(uint32(roundUp(int(end), unix.Getpagesize())), l.fixed)
	if end > want {
		return false
	}
	if err := l.ring.UpdateBuffers(uint32(l.bufBase+tag), [][]byte{l.bufs.slice(tag)[:want]}); err != nil {
		l.fixed = 0
		return false
	}
	t.reg = want
	return true
}

// teardown takes the queue out of its thread's ring tables (unless the ring
// is closed) and unmaps its memory. The queue has nothing in flight, or the
// ring is closed: the kernel no longer uses descriptors or buffers.
func (l *queueState) teardown() {
	if l.ring != nil && l.s != nil {
		if l.fileFlag != 0 {
			_ = l.ring.UpdateFiles(uint32(l.fileChar), []int32{-1, -1})
		}
		if l.bufs != nil {
			_ = l.ring.UpdateBuffers(uint32(l.bufBase), make([][]byte, l.cfg.Depth))
		}
	}
	l.b.close()
	l.descs.close()
	l.bufs.close()
	l.pool.close()
}

// touched puts the queue on the thread's list of queues whose counters
// the round's end publishes.
func (l *queueState) touched() {
	if !l.dirty {
		l.dirty = true
		l.s.dirty = append(l.s.dirty, l)
	}
}

// publish stores the queue's per-request counters in q.stats, for Stats
// and Pause to read from other goroutines.
func (l *queueState) publish() {
	l.dirty = false
	l.tally.publish(&l.q.stats, &l.shown)
}

// end records how the queue ended and tells its waiters.
func (l *queueState) end(err error) {
	l.publish()
	l.q.err = err
	if l.ownMtime {
		l.mtime.Close()
	}
	l.q.thread.unreserve(l.cfg.Depth)
	close(l.q.done)
}

// fail stops the queue from serving after err: a command the kernel
// refused, or a broken ring. The requests it has in flight finish; new
// ones stay with the kernel, held as if the server had died, and the
// failure is reported (Queue.Err) so that the device can be recovered.
func (l *queueState) fail(err error) {
	if l.failed {
		return
	}
	l.failed = true
	l.dropWaiting()
	if l.cmdErr == nil {
		l.cmdErr = fmt.Errorf("queue %d of ublk %d: %w", l.cfg.QID, l.cfg.DevID, err)
	}
	l.q.failure.Store(&l.cmdErr)
	l.mayEnd()
}

// mayEnd puts the queue on the thread's list of queues to check for the
// end (settle).
func (l *queueState) mayEnd() {
	if !l.inEnding {
		l.inEnding = true
		l.s.ending = append(l.s.ending, l)
	}
}

// fetchAll FETCHes every tag (in batch mode: PREPs every tag and arms the
// FETCH).
func (l *queueState) fetchAll() error {
	if l.b != nil {
		return l.prepAll()
	}
	for tag := range l.tags {
		if err := l.prepCmd(uapi.IOFetchReq, uint16(tag), 0); err != nil {
			return err
		}
	}
	return nil
}

// prepCmd queues a FETCH_REQ or COMMIT_AND_FETCH_REQ for tag.
func (l *queueState) prepCmd(op uint32, tag uint16, result int32) error {
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	sqe.PrepURingCmd(l.fileChar, op)
	sqe.Flags |= l.fileFlag
	sqe.UserData = encodeUD(udCmd, l.slot, tag)
	l.s.parked++
	if l.zc {
		// AUTO_BUF_REG: sqe->addr is struct ublk_auto_buf_reg (index =
		// the tag's buffer slot, no flags); the command's own addr
		// must stay 0.
		sqe.Addr = uint64(l.bufBase + tag)
		putIOCmd(sqe.Cmd(), l.cfg.QID, tag, result, 0)
		return nil
	}
	var addr uint64 // USER_COPY: the kernel copies nothing, the address must be 0
	if !l.uc {
		addr = l.bufs.addr(tag, 0)
	}
	putIOCmd(sqe.Cmd(), l.cfg.QID, tag, result, addr)
	return nil
}

// putIOCmd writes struct ublksrv_io_cmd into an SQE's 16-byte cmd area.
func putIOCmd(c *[16]byte, qid, tag uint16, result int32, addr uint64) {
	binary.LittleEndian.PutUint16(c[0:], qid)
	binary.LittleEndian.PutUint16(c[2:], tag)
	binary.LittleEndian.PutUint32(c[4:], uint32(result))
	binary.LittleEndian.PutUint64(c[8:], addr)
}

// done reports whether the device has ended the queue: every tag aborted
// (in batch mode: the FETCH) and nothing left in service.
func (l *queueState) done() bool {
	if l.b != nil {
		return l.batchDone()
	}
	return l.aborted == len(l.tags) && l.backing == 0
}
