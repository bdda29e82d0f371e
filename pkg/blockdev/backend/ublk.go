package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// ublkBackend adapts ublk.Server to Backend: it checks IDs, keeps the
// stable links <DevDir>/<volume-id>, and maps ublk's errors (standard
// library sentinels and errnos) onto this package's classes.
type ublkBackend struct {
	cfg     Config
	srv     *ublk.Server
	startup []error
}

var _ blockdev.Backend = (*ublkBackend)(nil)

// newUblkBackend opens the ublk control device and re-adopts the devices
// recorded under DataDir/ublk (user recovery), deleting those whose volume
// file is gone. Per-device failures there do not fail construction; they
// are returned by StartupErrors for the caller to log.
func newUblkBackend(cfg Config) (blockdev.Backend, error) {
	if cfg.DevDir == "" {
		cfg.DevDir = "/dev/fastblk"
	}
	m, err := parseUblkModes(cfg)
	if err != nil {
		return nil, err
	}
	srv, startup, err := ublk.NewServer(context.Background(), ublk.ServerConfig{
		StateDir:     filepath.Join(cfg.DataDir, blockdev.UblkStateDir),
		Owner:        cfg.Owner,
		BatchIO:      m.batch,
		ZeroCopy:     m.zeroCopy,
		UserCopy:     m.userCopy,
		NowaitWrites: m.nowait,
		Threads:      cfg.Threads,
		ThreadPolicy: ublk.ThreadPolicy(cfg.ThreadPolicy),
		Thread: ublk.ThreadConfig{Tags: cfg.ThreadTags, Ablation: m.ablation, PollInFlight: cfg.PollInFlight, Pin: cfg.PinThreads, Near: cfg.NearQueues, IOWQWorkers: cfg.IOWQWorkers,
			DiskSlots: cfg.DiskSlots},
		Queue:             ublk.QueueOptions{Poll: cfg.Poll, FixedBuffers: true, IdleReclaim: ublk.DefaultIdleReclaim},
		Report:            cfg.Report,
		FailUnservedAfter: cfg.FailUnservedAfter,
	})
	if err != nil {
		return nil, ublkErr("ublk backend", err)
	}
	b := &ublkBackend{cfg: cfg, srv: srv, startup: startup}
	for _, s := range srv.List() {
		if _, err := b.link(s.VolumeID, s.Path); err != nil {
			b.startup = append(b.startup, err)
		}
	}
	return b, nil
}

// ublkModes are the ublk server's switches, as Config names them.
type ublkModes struct {
	batch, zeroCopy, userCopy, nowait ublk.Mode // "": the server's defaults
	ablation                          ublk.Ablation
}

// parseUblkModes reads cfg's ublk switches, refusing bad ones (ErrInvalid)
// before anything is opened or loaded.
func parseUblkModes(cfg Config) (ublkModes, error) {
	var m ublkModes
	for _, f := range []struct {
		what string
		in   string
		out  *ublk.Mode
	}{{"ublk batch i/o", cfg.BatchIO, &m.batch}, {"ublk zero copy", cfg.ZeroCopy, &m.zeroCopy}, {"ublk user copy", cfg.UserCopy, &m.userCopy}, {"ublk nowait writes", cfg.NowaitWrites, &m.nowait}} {
		if f.in == "" {
			continue
		}
		var err error
		if *f.out, err = ublk.ParseMode(f.what, f.in); err != nil {
			return m, ublkErr("ublk backend", err)
		}
	}
	var err error
	if m.ablation, err = cfg.ablation(); err != nil {
		return m, ublkErr("ublk backend", err)
	}
	return m, nil
}

// StartupErrors returns what went wrong re-adopting or sweeping devices.
func (b *ublkBackend) StartupErrors() []error { return b.startup }

// Quarantined returns the device state files set aside as unreadable.
func (b *ublkBackend) Quarantined() []string { return b.srv.Quarantined() }

// Features returns the ublk driver's UBLK_F_* flags.
func (b *ublkBackend) Features() uint64 { return b.srv.Features() }

func (b *ublkBackend) Name() string { return "ublk" }

// MaxIOBytesLimit is the largest Tuning.MaxIOBytes a ublk device takes: the
// 1 MiB requests of zero copy.
const MaxIOBytesLimit = ublk.ZeroCopyMaxIOBytes

// Attach serves the volume file as /dev/ublkbN. Idempotent: a device
// already serving the volume is returned. The new device's change record
// starts untrusted (AttachTracked gives it the volume's record).
func (b *ublkBackend) Attach(ctx context.Context, req blockdev.AttachRequest) (blockdev.Device, error) {
	return b.AttachTracked(ctx, req, nil, false)
}

// AttachTracked is Attach whose new device's change record (package cbt)
// starts from changes, the ranges written since the volume's last
// snapshot, trusted when they are all of them. A device already serving
// the volume keeps its own record.
func (b *ublkBackend) AttachTracked(ctx context.Context, req blockdev.AttachRequest, changes []cbt.Extent, trusted bool) (blockdev.Device, error) {
	if !blockdev.IsVolumeID(req.VolumeID) {
		return blockdev.Device{}, fmt.Errorf("attach %q: volume id: %w", req.VolumeID, blockdev.ErrInvalid)
	}
	t := req.Tuning
	if t.Queues == 0 {
		t.Queues = b.cfg.Tuning.Queues
	}
	if t.QueueDepth == 0 {
		t.QueueDepth = b.cfg.Tuning.QueueDepth
	}
	if t.MaxIOBytes == 0 {
		t.MaxIOBytes = b.cfg.Tuning.MaxIOBytes
	}
	// Checked here too, before the narrowing to 32 bits could wrap it.
	if t.MaxIOBytes < 0 || t.MaxIOBytes > MaxIOBytesLimit {
		return blockdev.Device{}, fmt.Errorf("attach %s: max i/o bytes %d not in 0..%d: %w",
			req.VolumeID, t.MaxIOBytes, MaxIOBytesLimit, blockdev.ErrInvalid)
	}
	// The link is the device recorded with the volume: where the last
	// Attach put it. It outlives the process, so it names the device to
	// re-adopt if the volume's state file is lost (ublk heal).
	recorded, _ := os.Readlink(filepath.Join(b.cfg.DevDir, req.VolumeID))
	s, err := b.srv.Attach(ctx, ublk.AttachSpec{VolumeID: req.VolumeID, File: req.File, SizeBytes: req.SizeBytes,
		ReadOnly: req.ReadOnly, Queues: t.Queues, Depth: t.QueueDepth, MaxIOBytes: uint32(t.MaxIOBytes), Limits: req.Limits,
		KeepAllocated: req.KeepAllocated, RecordedDev: recorded, Changes: changes, ChangesTrusted: trusted})
	if err != nil {
		return blockdev.Device{}, ublkErr("attach "+req.VolumeID, err)
	}
	link, err := b.link(req.VolumeID, s.Path)
	if err != nil {
		return blockdev.Device{}, err
	}
	return b.device(s, link), nil
}

func (b *ublkBackend) device(s ublk.Served, link string) blockdev.Device {
	size, err := ublk.DeviceSize(s.DevID)
	if err != nil {
		size = s.SizeBytes
	}
	return blockdev.Device{VolumeID: s.VolumeID, Path: s.Path, Link: link, Backend: b.Name(),
		Tuning: blockdev.Tuning{Queues: s.Tuning.Queues, QueueDepth: s.Tuning.Depth, MaxIOBytes: int(s.Tuning.MaxIOBytes)},
		Limits: s.Limits, SizeBytes: size}
}

// Detach removes the volume's device and link. Unknown volumes return
// nil; a mounted or exclusively open device returns ErrBusy.
func (b *ublkBackend) Detach(ctx context.Context, volumeID string) error {
	_, _, _, err := b.DetachTracked(ctx, volumeID)
	return err
}

// DetachTracked is Detach that hands over the device's change record once
// its queues have ended (tracked false: no tracked device was detached).
func (b *ublkBackend) DetachTracked(ctx context.Context, volumeID string) (changes []cbt.Extent, trusted, tracked bool, err error) {
	if !blockdev.IsVolumeID(volumeID) {
		return nil, false, false, nil
	}
	ch, err := b.srv.DetachChanges(ctx, volumeID)
	if err != nil {
		return nil, false, false, ublkErr("detach "+volumeID, err)
	}
	link := filepath.Join(b.cfg.DevDir, volumeID)
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, false, false, fmt.Errorf("detach %s: remove link: %w", volumeID, err)
	}
	if ch == nil {
		return nil, false, false, nil
	}
	return ch.Extents, ch.Trusted, true, nil
}

// CutChanges returns the change record of the volume's device since its
// attach or last cut and starts a new one (ublk.Server.CutChanges); the
// caller holds the device's I/O. No tracked device is ErrNotFound.
func (b *ublkBackend) CutChanges(volumeID string) ([]cbt.Extent, bool, error) {
	ch, err := b.srv.CutChanges(volumeID)
	if err != nil {
		return nil, false, ublkErr("cut changes of "+volumeID, err)
	}
	return ch.Extents, ch.Trusted, nil
}

// PutBackChanges returns a cut to the volume's device when the snapshot it
// was for failed. A device gone meanwhile, or that handed its record over
// (HandOver), takes it no more: ErrNotFound, and the caller keeps it.
func (b *ublkBackend) PutBackChanges(volumeID string, changes []cbt.Extent, trusted bool) error {
	return ublkErr("put back changes of "+volumeID, b.srv.PutBackChanges(volumeID, ublk.Changes{Extents: changes, Trusted: trusted}))
}

// HandOver leaves the change record of the volume's device in its state
// file for the next process, as the plugin stops without releasing the
// device (ublk.Server.HandOver): the device's I/O stays held until the
// process ends and the next one re-adopts it.
func (b *ublkBackend) HandOver(ctx context.Context, volumeID string) error {
	return ublkErr("hand over "+volumeID, b.srv.HandOver(ctx, volumeID))
}

// Resize makes the device report sizeBytes (UPDATE_SIZE, Linux 6.16+);
// older kernels get an error wrapping ErrNotSupported.
func (b *ublkBackend) Resize(ctx context.Context, volumeID string, sizeBytes int64) error {
	if !blockdev.IsVolumeID(volumeID) {
		return fmt.Errorf("resize %q: %w", volumeID, blockdev.ErrNotFound)
	}
	return ublkErr("resize "+volumeID, b.srv.Resize(ctx, volumeID, sizeBytes))
}

// List returns the devices this backend serves, including re-adopted ones.
func (b *ublkBackend) List(ctx context.Context) ([]blockdev.Device, error) {
	var out []blockdev.Device
	for _, s := range b.srv.List() {
		out = append(out, b.device(s, filepath.Join(b.cfg.DevDir, s.VolumeID)))
	}
	return out, nil
}

// Close stops serving but leaves every device in place, quiesced with its
// I/O held, for the next process to re-adopt.
func (b *ublkBackend) Close() error { return ublkErr("close ublk backend", b.srv.Close()) }

// link points <DevDir>/<id> at path, replacing any older link atomically.
func (b *ublkBackend) link(id, path string) (string, error) {
	link := filepath.Join(b.cfg.DevDir, id)
	return link, replaceLink(link, path)
}

// ublkErr wraps err with op and the class its cause belongs to.
func ublkErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var class error
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		class = blockdev.ErrNotSupported
	case errors.Is(err, os.ErrInvalid):
		class = blockdev.ErrInvalid
	case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ENODEV):
		class = blockdev.ErrNotFound
	case errors.Is(err, os.ErrExist):
		class = blockdev.ErrConflict
	case errors.Is(err, unix.EBUSY):
		class = blockdev.ErrBusy
	default:
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w: %w", op, class, err)
}

var (
	_ blockdev.IOStatser   = (*ublkBackend)(nil)
	_ blockdev.LimitSetter = (*ublkBackend)(nil)
)

// SetLimits changes the rate limits of the volume's live device at once.
func (b *ublkBackend) SetLimits(ctx context.Context, volumeID string, lim qos.Limits) error {
	return ublkErr("set limits of "+volumeID, b.srv.SetLimits(volumeID, lim))
}

// IOStats sums the counters the device's queues keep: errors,
// requests in flight and the latency histogram (arrival to commit).
// Recoveries counts this process's re-adoptions of the device: from an
// earlier process, and in the process after a server thread failed.
func (b *ublkBackend) IOStats(volumeID string) (blockdev.IOStats, bool) {
	total, recoveries, ok := b.srv.Stats(volumeID)
	if !ok {
		return blockdev.IOStats{}, false
	}
	st := blockdev.IOStats{
		Recoveries:       recoveries,
		State:            "live",
		Errors:           total.Errors,
		InFlight:         total.InFlight,
		LatencySum:       float64(total.LatencyNs) / 1e9,
		Throttled:        total.Throttled,
		ThrottledSeconds: float64(total.ThrottledNs) / 1e9,
	}
	if err := b.srv.Err(volumeID); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A queue or its server thread failed: the device's I/O is
		// held by the kernel until the device is recovered.
		st.State, st.Reason = "failed", err.Error()
	}
	var cum uint64
	for i, bound := range ublk.LatencyBuckets {
		cum += total.Latency[i]
		st.LatencyBounds = append(st.LatencyBounds, bound.Seconds())
		st.LatencyCounts = append(st.LatencyCounts, cum)
	}
	st.LatencyCount = cum + total.Latency[len(ublk.LatencyBuckets)]
	return st, true
}

var _ blockdev.HealthReporter = (*ublkBackend)(nil)

// Health fails while a device holds its I/O because its queue or server
// thread failed and the server did not heal it (ublk.Server.Health).
func (b *ublkBackend) Health() error {
	if err := b.srv.Health(); err != nil {
		return fmt.Errorf("ublk server: %w", err)
	}
	return nil
}

var _ blockdev.HeldReporter = (*ublkBackend)(nil)

// Held returns, by volume, why a device kept for it is not served (its
// state file lost, the volume's record and the kernel disagreeing: see
// ublk.Server.Held). Unlike Health, it does not fail the plugin's
// liveness: a restart cannot resolve it. A reason that says that devices
// fail their I/O (ublk.ErrFailingIO) wraps blockdev.ErrFailingIO.
func (b *ublkBackend) Held() map[string]error {
	held := b.srv.Held()
	for id, err := range held {
		if errors.Is(err, ublk.ErrFailingIO) {
			held[id] = fmt.Errorf("%w (%w)", err, blockdev.ErrFailingIO)
		}
	}
	return held
}

// FailingIO returns, by block device, since when the server fails the I/O
// of the devices it keeps but cannot re-adopt (Config.FailUnservedAfter).
func (b *ublkBackend) FailingIO() map[string]time.Time { return b.srv.FailingIO() }

var _ blockdev.IOHolder = (*ublkBackend)(nil)

// HoldIO holds the I/O of the volume's device until release: requests that
// arrive wait in the server, and none reaches the backing file (ublk.Server
// Pause), so a snapshot or clone of a raw block volume in use is crash
// consistent.
func (b *ublkBackend) HoldIO(ctx context.Context, volumeID string) (func() error, error) {
	resume, err := b.srv.Pause(ctx, volumeID)
	if err != nil {
		return nil, ublkErr("quiesce "+volumeID, err)
	}
	return func() error { resume(); return nil }, nil
}
