package bench

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// job is one fio-like job: a locked thread, a ring, an fd, iodepth buffers.
type job struct {
	cfg  *Config
	id   int
	stop *atomic.Bool

	ring   *uring.Ring
	fd     int
	bufs   *uring.Buffers
	sent   []time.Time // submit time per slot
	rng    uint64
	perm   *blockPerm // random offsets without repeats (nil: uniform draws)
	seq    uint64     // next sequential block
	blocks uint64
	write  bool
	random bool

	prepped     int // prepared since the last submission
	ios, enters uint64
	lat         hist
	offered     time.Time     // last offer of the thread to the Go scheduler
	offers      atomic.Uint64 // read by tests while the job runs
}

func (j *job) run() (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := j.setup(); err != nil {
		j.close()
		return fmt.Errorf("bench job %d: %w", j.id, err)
	}
	defer func() {
		if cerr := j.close(); err == nil && cerr != nil {
			err = fmt.Errorf("bench job %d: %w", j.id, cerr)
		}
	}()
	if err := j.loop(); err != nil {
		return fmt.Errorf("bench job %d: %w", j.id, err)
	}
	return nil
}

func (j *job) setup() error {
	c := j.cfg
	j.write = c.RW == "write" || c.RW == "randwrite"
	j.random = c.RW == "randread" || c.RW == "randwrite"
	j.blocks = uint64(c.Size / int64(c.BS))
	j.rng = uint64(j.id)*0x9e3779b97f4a7c15 + uint64(time.Now().UnixNano()) | 1
	if j.random && !c.NoRandomMap {
		j.perm = newBlockPerm(j.blocks, j.rng)
	}
	j.sent = make([]time.Time, c.IODepth)
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if c.Direct {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(c.File, flags, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", c.File, err)
	}
	j.fd = fd
	if j.bufs, err = uring.NewBuffers(c.IODepth, c.BS); err != nil {
		return err
	}
	for i := range j.bufs.Bytes() {
		j.bufs.Bytes()[i] = byte(j.next())
	}
	d := uint32(c.IODepth)
	if j.ring, err = uring.New(uring.Config{Entries: d, CQEntries: 2 * d, Flags: uring.QueueFlags}); err != nil {
		return err
	}
	if err := j.ring.RegisterRingFD(); err != nil {
		return err
	}
	if c.NoFixed {
		return nil
	}
	if err := j.ring.RegisterFiles([]int32{int32(fd)}); err != nil {
		return err
	}
	return j.ring.RegisterBuffers(j.bufs.Slots())
}

func (j *job) close() error {
	var err error
	if j.ring != nil {
		err = j.ring.Close()
	}
	if j.bufs != nil {
		j.bufs.Close()
	}
	if j.fd > 0 {
		unix.Close(j.fd)
	}
	return err
}

// next is xorshift64*.
func (j *job) next() uint64 {
	j.rng ^= j.rng >> 12
	j.rng ^= j.rng << 25
	j.rng ^= j.rng >> 27
	return j.rng * 2685821657736338717
}

// prep queues one I/O for slot.
func (j *job) prep(slot int, now time.Time) {
	var blk uint64
	switch {
	case j.perm != nil:
		blk = j.perm.next()
	case j.random:
		blk = j.next() % j.blocks
	default:
		blk = j.seq
		j.seq = (j.seq + 1) % j.blocks
	}
	off := blk * uint64(j.cfg.BS)
	s := j.ring.GetSQE()
	buf := j.bufs.Slot(slot)[:j.cfg.BS]
	switch {
	case j.cfg.NoFixed && j.write:
		s.PrepWrite(int32(j.fd), buf, off)
	case j.cfg.NoFixed:
		s.PrepRead(int32(j.fd), buf, off)
	case j.write:
		s.PrepWriteFixed(0, buf, off, uint16(slot))
		s.Flags |= uring.IOSQE_FIXED_FILE
	default:
		s.PrepReadFixed(0, buf, off, uint16(slot))
		s.Flags |= uring.IOSQE_FIXED_FILE
	}
	s.UserData = uint64(slot)
	j.sent[slot] = now
}

// poll submits what is prepared and checks the rings for completions for
// up to Config.Poll; it returns how many it reaped (0: none in time, or
// polling is off).
func (j *job) poll(cqes []uring.CQE) int {
	if j.cfg.Poll <= 0 {
		return 0
	}
	if _, err := j.ring.Submit(); err != nil {
		return 0 // the wait that follows submits again and reports it
	}
	until := time.Now().Add(j.cfg.Poll)
	for {
		if n := j.ring.Reap(cqes); n > 0 || time.Now().After(until) {
			return n
		}
	}
}

// loop keeps iodepth I/Os in flight until stopped, then drains. Each
// wait is for a batch of completions (WaitMin); each freed slot is refilled
// and, with SubmitBatch 1, handed to the kernel at once. Before a sleeping
// wait the thread offers itself to the Go scheduler every
// uring.OfferInterval, as the ublk queue threads do.
func (j *job) loop() error {
	cqes := make([]uring.CQE, 2*j.cfg.IODepth)
	now := time.Now()
	for slot := range j.cfg.IODepth {
		j.prep(slot, now)
	}
	wait := uint32(j.cfg.WaitMin)
	for {
		stopping := j.stop.Load()
		if stopping && j.ring.InFlight() == 0 && j.ring.Pending() == 0 {
			break
		}
		n := j.poll(cqes)
		if n == 0 && uring.OfferDue(time.Since(j.offered)) {
			// As a ublk queue thread does before it sleeps.
			if _, err := j.ring.Submit(); err != nil {
				return err
			}
			runtime.Gosched()
			j.offered = time.Now()
			j.offers.Add(1)
		}
		if n == 0 {
			if _, err := j.ring.SubmitAndWait(wait, 0); err != nil {
				return err
			}
			n = j.ring.Reap(cqes)
		}
		j.prepped = 0
		now = time.Now()
		for _, c := range cqes[:n] {
			if c.Res != int32(j.cfg.BS) {
				return fmt.Errorf("io at slot %d: res %d", c.UserData, c.Res)
			}
			slot := int(c.UserData)
			j.lat.record(now.Sub(j.sent[slot]))
			j.ios++
			if stopping {
				continue
			}
			j.prep(slot, now)
			if j.prepped++; j.cfg.SubmitBatch > 0 && j.prepped >= j.cfg.SubmitBatch {
				if _, err := j.ring.Submit(); err != nil {
					return err
				}
				j.prepped = 0
			}
		}
	}
	j.enters = j.ring.Enters()
	return nil
}
