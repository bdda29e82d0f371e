package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// Device node paths.
func charPath(id uint32) string  { return fmt.Sprintf("/dev/ublkc%d", id) }
func blockPath(id uint32) string { return fmt.Sprintf("/dev/ublkb%d", id) }

// nodeWait bounds how long a device node may take to appear.
const nodeWait = 10 * time.Second

// DeviceConfig describes a device to create or re-adopt.
type DeviceConfig struct {
	Target    Target
	SizeBytes int64
	// Tuning is the device's geometry; a re-adopted device takes its
	// queues, depth and request size from the kernel, and only its
	// PoolBytes from here.
	Tuning Tuning
	// Flags are the ADD_DEV flags (see AddFlags).
	Flags    uint64
	ReadOnly bool
	// DMAAlign is the memory alignment the backing file needs for direct
	// I/O (statx dio_mem_align); 0 means 512.
	DMAAlign uint32
	// Owner is stored in dev_info.ublksrv_flags, which the kernel keeps
	// for the server: it proves later which devices are ours.
	Owner uint64
	// Queue is every queue's submission and wait policy.
	Queue QueueOptions
	// Limiter paces the device's reads and writes, shared by its queues;
	// nil means unlimited.
	Limiter *qos.Limiter
	// Threads serve the device's queues, spread by SpreadQueues.
	Threads *dataplane.Threads
	// Gate pauses the device's queues (Pause); nil: a new, open one. A
	// device re-adopted in-process keeps its predecessor's, so that a
	// pause in force goes on (healThread).
	Gate *dataplane.Gate
	// Changes records the ranges the device's writes, discards and
	// write-zeroes change: queue q marks Changes.Queue(q), so it must
	// have a bitmap for every queue. nil: not tracked.
	Changes *cbt.Tracker
	// Persist is called after ADD_DEV, before START_DEV makes the device
	// visible, with the negotiated info; an error aborts the creation.
	Persist func(DevInfo) error
}

// Device is a ublk device served by this process: the open /dev/ublkcN
// and one Queue per hardware queue. Not safe for concurrent use; the
// caller serialises operations on one device.
type Device struct {
	ctl    *Control // shared, not owned
	info   DevInfo
	char   int // /dev/ublkcN, -1 once released
	queues []*dataplane.Queue
	// started: START_DEV succeeded (or the device was recovered), so
	// removing it takes STOP_DEV, even when a later step of its creation
	// failed.
	started bool
	// mtime is the queues' shared QueueConfig.Mtime (nil without
	// NowaitWrites), gate their QueueConfig.Gate.
	mtime *dataplane.MtimeToucher
	gate  *dataplane.Gate
}

// newDevice returns the Device of info before its queues start.
func newDevice(ctl *Control, info DevInfo, started bool, gate *dataplane.Gate) *Device {
	if gate == nil {
		gate = new(dataplane.Gate)
	}
	return &Device{ctl: ctl, info: info, char: -1, started: started, gate: gate}
}

// Info returns the device's negotiated info.
func (d *Device) Info() DevInfo { return d.info }

// ID is the ublk device id N.
func (d *Device) ID() uint32 { return d.info.DevID }

// BlockPath is /dev/ublkbN.
func (d *Device) BlockPath() string { return blockPath(d.info.DevID) }

// Stats returns every queue's counters.
func (d *Device) Stats() []QueueStats {
	s := make([]QueueStats, len(d.queues))
	for i, q := range d.queues {
		s[i] = q.Stats()
	}
	return s
}

// Err reports why the device is not fully served: the first failure of
// one of its queues or of a thread serving it, or nil.
func (d *Device) Err() error {
	for _, q := range d.queues {
		if err := q.Err(); err != nil {
			return err
		}
	}
	return nil
}

// CreateDevice adds, configures and starts a device: ADD_DEV, Persist,
// open /dev/ublkcN, SET_PARAMS, one queue per hardware queue on the server
// threads (cfg.Threads), START_DEV, then waits for /dev/ublkbN. On failure
// everything it made is removed again.
func CreateDevice(ctx context.Context, ctl *Control, cfg DeviceConfig) (*Device, error) {
	if cfg.SizeBytes <= 0 || cfg.SizeBytes%4096 != 0 {
		return nil, fmt.Errorf("create ublk device: size %d is not a positive multiple of 4096: %w", cfg.SizeBytes, errInvalid)
	}
	info, err := ctl.AddDev(DevInfo{
		NrHWQueues: uint16(cfg.Tuning.Queues), QueueDepth: uint16(cfg.Tuning.Depth),
		MaxIOBufBytes: cfg.Tuning.MaxIOBytes, DevID: ^uint32(0), Flags: cfg.Flags, UblksrvFlags: cfg.Owner,
	})
	if err != nil {
		return nil, err
	}
	d := newDevice(ctl, info, false, cfg.Gate)
	if err := d.bringUp(ctx, cfg); err != nil {
		return nil, errors.Join(err, d.teardown(context.WithoutCancel(ctx)))
	}
	return d, nil
}

func (d *Device) bringUp(ctx context.Context, cfg DeviceConfig) error {
	if cfg.Persist != nil {
		if err := cfg.Persist(d.info); err != nil {
			return fmt.Errorf("persist ublk device %d: %w", d.ID(), err)
		}
	}
	if err := d.openChar(ctx); err != nil {
		return err
	}
	if err := d.ctl.setParams(d.ID(), deviceParams(cfg, d.info)); err != nil {
		return err
	}
	if err := d.startQueues(cfg); err != nil {
		return err
	}
	if err := d.ctl.StartDev(d.ID(), os.Getpid()); err != nil {
		return err
	}
	d.started = true
	if err := failAt(fpStarted); err != nil {
		return err
	}
	return waitNode(ctx, d.BlockPath())
}

// deviceParams builds SET_PARAMS: 4 KiB logical and physical blocks,
// VOLATILE_CACHE|FUA (so FLUSH and FUA reach the server), max_sectors
// from max_io_buf_bytes, discard and write-zeroes in 4 KiB granules, and
// the DMA alignment (kernels before 6.15 ignore the type they lack).
func deviceParams(cfg DeviceConfig, info DevInfo) uapi.Params {
	p := uapi.Params{Len: uapi.SizeofParams, Types: uapi.ParamTypeBasic | uapi.ParamTypeDiscard | uapi.ParamTypeDMAAlign}
	p.Basic = uapi.ParamBasic{
		Attrs:          uapi.AttrVolatileCache | uapi.AttrFUA,
		LogicalBSShift: 12, PhysicalBSShift: 12, IOOptShift: 12, IOMinShift: 12,
		MaxSectors: info.MaxIOBufBytes >> 9,
		DevSectors: uint64(cfg.SizeBytes) >> 9,
	}
	if cfg.ReadOnly {
		p.Basic.Attrs |= uapi.AttrReadOnly
	}
	p.Discard = uapi.ParamDiscard{
		DiscardGranularity: 4096, MaxDiscardSectors: dataplane.MaxZeroSectors,
		MaxWriteZeroesSectors: dataplane.MaxZeroSectors, MaxDiscardSegments: 1,
	}
	align := max(cfg.DMAAlign, 512)
	if align > 4096 {
		align = 4096
	}
	p.DMA.Alignment = align - 1
	return p
}

// openChar opens /dev/ublkcN, polling until it appears. EBUSY (the old
// server's fd not yet released) is retried too.
func (d *Device) openChar(ctx context.Context) error {
	path := charPath(d.ID())
	err := poll(ctx, nodeWait, func() (bool, error) {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		d.char = fd
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	return nil
}

// startQueues starts one queue per hardware queue on the server threads
// SpreadQueues picks, or near the queue's CPUs (ThreadConfig.Near).
func (d *Device) startQueues(cfg DeviceConfig) error {
	if cfg.Threads == nil {
		return fmt.Errorf("ublk device %d: no server threads: %w", d.ID(), errInvalid)
	}
	near := make([][]int, d.info.NrHWQueues)
	if cfg.Threads.Near() {
		for q := range near {
			// Without it (an error), the queue is spread as by Pick:
			// served all the same, only perhaps across CPUs.
			near[q], _ = d.ctl.QueueAffinity(d.ID(), uint16(q))
		}
	}
	threads, err := cfg.Threads.PickNear(near, d.info.QueueDepth)
	if err != nil {
		return fmt.Errorf("ublk device %d: %w", d.ID(), err)
	}
	if d.mtime == nil && cfg.Queue.NowaitWrites && cfg.Target.Kind == dataplane.TargetFile {
		d.mtime = dataplane.NewMtimeToucher(cfg.Target.FD)
	}
	slots := 0
	if cfg.Target.Kind == dataplane.TargetFile {
		slots = diskSlots(cfg.Target.FD, cfg.Threads.Len())
	}
	for q := uint16(0); q < d.info.NrHWQueues; q++ {
		var changes *cbt.Bitmap
		if cfg.Changes != nil {
			if changes = cfg.Changes.Queue(int(q)); changes == nil {
				dataplane.UnreserveAll(threads[q:], d.info.QueueDepth)
				return fmt.Errorf("ublk device %d: change record has no bitmap for queue %d: %w", d.ID(), q, errInvalid)
			}
		}
		queue, err := dataplane.StartQueue(dataplane.QueueConfig{
			DevID: d.ID(), QID: q, Depth: d.info.QueueDepth, CharFD: d.char,
			Flags: d.info.Flags, MaxIOBytes: d.info.MaxIOBufBytes, PoolBytes: int(cfg.Tuning.PoolBytes) / int(d.info.NrHWQueues), Target: cfg.Target, Options: cfg.Queue, Limiter: cfg.Limiter,
			Mtime: d.mtime, Gate: d.gate, Thread: threads[q], Reserved: true, DiskSlots: slots, Changes: changes,
		})
		if err != nil {
			dataplane.UnreserveAll(threads[q+1:], d.info.QueueDepth)
			return err
		}
		d.queues = append(d.queues, queue)
	}
	return nil
}

// waitNode polls until path exists.
func waitNode(ctx context.Context, path string) error {
	err := poll(ctx, nodeWait, func() (bool, error) {
		_, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("wait for %s: %w", path, err)
	}
	return nil
}

// poll calls try every few milliseconds until it reports done, fails, the
// context ends or limit passes (an error matching unix.ETIME).
func poll(ctx context.Context, limit time.Duration, try func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := try()
		if done || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s: %w", limit, unix.ETIME)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// waitQueues waits for every queue to end, bounded by ctx and nodeWait.
// d.queues stays as it is (Stats may read it at any time).
func (d *Device) waitQueues(ctx context.Context) error {
	timer := time.NewTimer(nodeWait)
	defer timer.Stop()
	var errs []error
	for _, q := range d.queues {
		select {
		case <-q.Done():
			if err := q.Wait(); err != nil && !errors.Is(err, dataplane.ErrQueueStopped) {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("wait for queues of ublk device %d: %w", d.ID(), ctx.Err())
		case <-timer.C:
			return fmt.Errorf("wait for queues of ublk device %d: %w", d.ID(), unix.ETIME)
		}
	}
	return errors.Join(errs...)
}

// closeChar closes /dev/ublkcN, and ends the mtime updates once every
// queue has ended (a queue that runs may still ask for one).
func (d *Device) closeChar() error {
	if d.queuesEnded() {
		d.mtime.Close()
		d.mtime = nil
	}
	if d.char < 0 {
		return nil
	}
	err := unix.Close(d.char)
	d.char = -1
	return err
}

// errQueuesLive is the class of a removal that left the device's fds
// open because a queue did not end: closing them under its thread could
// hand their numbers to other files while it still uses them.
var errQueuesLive = errors.New("queues still running, their fds left open")

// teardown removes the device: STOP_DEV when it was started or a queue
// still runs (the queues then see -ENODEV and leave) and waiting for its
// queues; once every queue has ended,
// /dev/ublkcN is closed and DEL_DEV_ASYNC sent (DEL_DEV, bounded, on kernels
// before 6.9) so a process still holding /dev/ublkbN open cannot hang us.
// If a queue does not end, the fds stay open, DEL_DEV is not sent and the
// error wraps errQueuesLive; a later teardown can finish the removal.
func (d *Device) teardown(ctx context.Context) error {
	var errs []error
	// A started device, whoever calls, is stopped. A device that never
	// started has its queues' FETCHes parked all the same, and only
	// STOP_DEV ends them (their threads serve other devices).
	if d.started || !d.queuesEnded() {
		if err := d.ctl.StopDev(d.ID()); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, err)
		} else {
			errs = append(errs, d.waitQueues(ctx))
		}
	}
	if !d.queuesEnded() {
		// STOP_DEV failed or did not end them in time: give them
		// another nodeWait.
		errs = append(errs, d.waitQueues(ctx))
	}
	if !d.queuesEnded() {
		errs = append(errs, fmt.Errorf("remove ublk device %d: %w", d.ID(), errQueuesLive))
		return errors.Join(errs...)
	}
	errs = append(errs, d.closeChar(), failAt(fpDeleting), deleteDev(d.ctl, d.ID()))
	return errors.Join(errs...)
}

// queuesEnded reports whether every queue of the device has ended.
func (d *Device) queuesEnded() bool {
	for _, q := range d.queues {
		select {
		case <-q.Done():
		default:
			return false
		}
	}
	return true
}

// Delete stops and removes the device. The block device disappears; a
// mount on it must be gone first (the caller unmounts before Detach).
func (d *Device) Delete(ctx context.Context) error {
	return d.teardown(ctx)
}

// Release stops serving without stopping the device: its queues leave,
// /dev/ublkcN is closed, and the kernel keeps the device QUIESCED (user
// recovery) with its I/O held until another process re-adopts it. Its
// queues leave when QUIESCE_DEV (Linux 6.16+) aborts their parked commands:
// without it one device cannot be released alone (closing the shared
// threads, Threads.Close, releases all of them): the error then wraps
// errQueuesLive and errors.ErrUnsupported, and /dev/ublkcN stays open, as
// must the backing file, since the queues still use both.
func (d *Device) Release(ctx context.Context) error {
	if !d.queuesEnded() {
		if d.info.Flags&FlagQuiesce == 0 {
			return fmt.Errorf("release ublk device %d alone: its queues run on shared server threads and the driver lacks QUIESCE (Linux 6.16+): %w: %w",
				d.ID(), errQueuesLive, errors.ErrUnsupported)
		}
		if err := d.ctl.QuiesceDev(d.ID(), quiesceWait); err != nil {
			return fmt.Errorf("release ublk device %d: %w", d.ID(), err)
		}
	}
	return errors.Join(d.waitQueues(ctx), d.closeChar())
}

// quiesceWait bounds how long QUIESCE_DEV waits for the device's requests
// in flight to complete.
const quiesceWait = 5 * time.Second

// Resize changes the size of the live device (UPDATE_SIZE). Without
// UBLK_F_UPDATE_SIZE it returns an error wrapping errors.ErrUnsupported.
func (d *Device) Resize(sizeBytes int64) error {
	if d.info.Flags&FlagUpdateSize == 0 {
		return fmt.Errorf("resize ublk device %d: driver lacks UPDATE_SIZE (Linux 6.16+): %w", d.ID(), errors.ErrUnsupported)
	}
	if sizeBytes <= 0 || sizeBytes%4096 != 0 {
		return fmt.Errorf("resize ublk device %d: size %d: %w", d.ID(), sizeBytes, errInvalid)
	}
	return d.ctl.UpdateSize(d.ID(), sizeBytes)
}

// deleteDev sends DEL_DEV_ASYNC, or DEL_DEV where the kernel lacks it.
// An already deleted device (ENODEV) is success.
func deleteDev(ctl *Control, id uint32) error {
	err := ctl.DelDev(id, true)
	if err != nil && errnoUnknown(err) {
		err = ctl.DelDev(id, false)
	}
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}
