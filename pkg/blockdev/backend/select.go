package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/owner"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// Config configures whichever backend is selected.
type Config struct {
	// DataDir is the Store's data directory; backends only list and
	// adopt devices whose backing files live under it or under one of
	// ClassDirs. Its owner token, ublk device records and loop marks
	// serve them all.
	DataDir string
	// ClassDirs are the data directories of the node's other device
	// classes (package devclass), whose volume files the backend serves
	// too.
	ClassDirs []string
	// Owner marks the devices of this data directory; backends only list,
	// adopt and detach devices carrying it. Zero means
	// owner.Ensure(DataDir).
	Owner uint64
	// AdoptUnmarked (loop only) marks as ours, once per data directory,
	// the loop devices a plugin without owner marks bound to this
	// directory's volume files (their lo_file_name is their path, and
	// their backing inode is the volume file's), so that the upgraded
	// plugin finds the devices of staged volumes again. Done is recorded
	// in <DataDir>/loop-marked; later starts skip it, since losetup
	// names devices the same way. The plugin sets it; tests of foreign
	// devices leave it off.
	AdoptUnmarked bool
	// DevDir holds the stable links <DevDir>/<volume-id> (default /dev/fastblk).
	DevDir string
	// Default tuning when a volume does not ask for its own (zero = auto).
	Tuning blockdev.Tuning
	// Poll (ublk only) bounds how long a server thread polls for
	// completions after a busy round before it sleeps (see
	// ublk.QueueOptions.Poll). It trades CPU time for latency; 0 never
	// polls.
	Poll time.Duration
	// BatchIO (ublk only) is "on", "auto" (where the kernel offers it) or
	// "off" ("" = off): new devices fetch and commit requests in batches
	// (see ublk.ServerConfig.BatchIO).
	BatchIO string
	// Threads (ublk only) is how many server threads serve every
	// device's queues; 0 means one per CPU the plugin may use, at most
	// its cgroup's CPU limit (rounded up).
	Threads int
	// ThreadPolicy (ublk only) is "shared" (Threads threads serve every
	// device) or "device" (each device its own thread, up to Threads,
	// 0 meaning ublk.DefaultDeviceThreads); "" means the default.
	ThreadPolicy string
	// Benchmark knobs (ublk only; zero: the product's defaults):
	// ThreadTags sizes each server thread (ublk.ThreadConfig.Tags),
	// ZeroCopy is "auto", "on" or "off", PollInFlight is the most requests
	// in service with which a server thread still polls
	// (ublk.ThreadConfig.PollInFlight), PinThreads pins server thread i
	// to the i-th CPU (ublk.ThreadConfig.Pin), IOWQWorkers fixes each
	// thread's io-wq cap (ublk.ThreadConfig.IOWQWorkers).
	ThreadTags   int
	ZeroCopy     string
	PollInFlight int
	PinThreads   bool
	// NearQueues pins the threads and places each queue on the thread of
	// a CPU blk-mq maps to it (ublk.ThreadConfig.Near).
	NearQueues  bool
	IOWQWorkers uint32
	// UserCopy is "auto", "on" or "off" ("" = auto): new devices without
	// zero copy copy through /dev/ublkcN (ublk.ServerConfig.UserCopy).
	UserCopy string
	// NowaitWrites is "auto", "on" or "off" ("" = auto): new devices keep
	// their backing file's mtime current and send writes with RWF_NOWAIT
	// (ublk.ServerConfig.NowaitWrites).
	NowaitWrites string
	// DiskSlots bounds each server thread's reads and writes in flight on
	// the backing disk (ublk.ThreadConfig.DiskSlots; 0: no bound, -1: the
	// thread's share of the disk's request slots).
	DiskSlots int
	// ablationConfig has Ablate, the techniques of the ublk server
	// threads to switch off, in benchmark builds (-tags ablation) only.
	ablationConfig
	// UblkControl is the ublk control device whose presence makes "auto"
	// try ublk ("" = /dev/ublk-control). The ublk backend itself always
	// opens /dev/ublk-control; tests point this elsewhere to exercise the
	// fallback on hosts without ublk.
	UblkControl string
	// Report, when set, is told what goes wrong in the background, with
	// no caller to return it to (a ublk server thread that fails); its
	// arguments are klog.ErrorS's. Nil drops the reports.
	Report func(err error, msg string, keysAndValues ...any)
	// FailUnservedAfter (ublk only) bounds how long a ublk device the
	// plugin keeps but cannot re-adopt holds its I/O before it fails it
	// (ublk.ServerConfig.FailUnservedAfter); 0: for ever.
	FailUnservedAfter time.Duration
}

// UblkControl is the ublk control device; its presence selects ublk in "auto".
const UblkControl = "/dev/ublk-control"

// Reasons "auto" falls back to loop, as Fallback.Reason (a metric label).
const (
	FallbackUblkAbsent     = "ublk_absent"      // the kernel has no ublk_drv (not built in, no such module, no module loading)
	FallbackUblkLoadFailed = "ublk_load_failed" // ublk_drv exists but could not be loaded, or its control device did not appear
	FallbackIOUringRefused = "io_uring_refused" // io_uring_setup or io_uring_enter refused: sysctl, seccomp
	FallbackUblkTimeout    = "ublk_timeout"     // a ublk control command did not answer in time
	FallbackUblkFailed     = "ublk_failed"      // any other failure to start the ublk backend
)

// Fallback says why "auto" serves volumes with loop devices.
type Fallback struct {
	Reason string // one of the Fallback* reasons
	Err    error  // what failed
}

// controlWait bounds the wait for the ublk control device after ublk_drv
// is loaded (devtmpfs makes it as the module starts; a /dev that is not
// the host's devtmpfs never shows it).
const controlWait = 5 * time.Second

// loadUblk makes the ublk control device exist: it loads ublk_drv unless
// the device is there, and waits for the device to appear.
func loadUblk(control string) error {
	if _, err := os.Stat(control); err == nil {
		return nil
	}
	if err := kernel.LoadModule(context.Background(), "ublk_drv"); err != nil {
		return err
	}
	for deadline := time.Now().Add(controlWait); ; time.Sleep(20 * time.Millisecond) {
		_, err := os.Stat(control)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ublk_drv is loaded, but %s did not appear within %v (is /dev the host's devtmpfs?): %w", control, controlWait, err)
		}
	}
}

// loadFailure classifies loadUblk's error.
func loadFailure(err error) *Fallback {
	if errors.Is(err, kernel.ErrNoModules) || errors.Is(err, kernel.ErrModuleAbsent) {
		return &Fallback{Reason: FallbackUblkAbsent, Err: err}
	}
	return &Fallback{Reason: FallbackUblkLoadFailed, Err: err}
}

// NewBackend returns the backend named kind: "loop", "ublk", or "auto"
// (ublk when it works, loading ublk_drv first where the kernel has it and
// has not loaded it; loop otherwise).
func New(kind string, cfg Config) (blockdev.Backend, error) {
	b, _, err := Select(kind, cfg)
	return b, err
}

// SelectBackend is NewBackend that also says, for "auto", why it chose loop
// (nil when it did not fall back). "auto" never fails for ublk's sake: a
// kernel without ublk_drv, a module that cannot be loaded, io_uring
// refused by the kernel (kernel.io_uring_disabled) or a seccomp filter, a
// ublk control command that times out, or any other ublk start-up error
// make it fall back to loop. "ublk" fails with that error instead.
func Select(kind string, cfg Config) (blockdev.Backend, *Fallback, error) {
	if cfg.DataDir == "" {
		return nil, nil, fmt.Errorf("%s backend: no data directory: %w", kind, blockdev.ErrInvalid)
	}
	if cfg.Owner == 0 {
		err := os.MkdirAll(cfg.DataDir, 0o700)
		if err == nil {
			cfg.Owner, err = owner.Ensure(cfg.DataDir)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s backend: %w", kind, err)
		}
	}
	control := cfg.UblkControl
	if control == "" {
		control = UblkControl
	}
	switch kind {
	case "auto":
		if err := loadUblk(control); err != nil {
			b, lerr := newLoopBackend(cfg)
			if lerr != nil {
				return nil, nil, fmt.Errorf("ublk backend: %w; loop backend: %w", err, lerr)
			}
			return b, loadFailure(err), nil
		}
		b, err := startUblk(cfg)
		if err == nil {
			return b, nil, nil
		}
		fb := &Fallback{Reason: fallbackReason(err), Err: err}
		lb, lerr := newLoopBackend(cfg)
		if lerr != nil {
			return nil, nil, fmt.Errorf("%w; loop backend: %w", err, lerr)
		}
		return lb, fb, nil
	case "ublk":
		if _, err := parseUblkModes(cfg); err != nil {
			return nil, nil, err
		}
		if err := loadUblk(control); err != nil {
			return nil, nil, fmt.Errorf("ublk backend: %w", err)
		}
		b, err := startUblk(cfg)
		return b, nil, err
	case "loop":
		b, err := newLoopBackend(cfg)
		return b, nil, err
	}
	return nil, nil, fmt.Errorf("backend %q: %w (want auto, ublk or loop)", kind, blockdev.ErrInvalid)
}

// startUblk checks that io_uring works, then starts the ublk backend.
func startUblk(cfg Config) (blockdev.Backend, error) {
	if err := ProbeIOUring(); err != nil {
		return nil, fmt.Errorf("ublk backend: %w", err)
	}
	return newUblkBackend(cfg)
}

// errIOUringRefused marks ProbeIOUring's errors.
var errIOUringRefused = errors.New("io_uring refused")

// ProbeIOUring creates a ring and runs one no-op through it, bounded by a
// second. An error says why io_uring cannot serve here, naming the
// kernel.io_uring_disabled sysctl when it is set and a seccomp filter
// otherwise; it wraps the errno.
func ProbeIOUring() error {
	r, err := uring.New(uring.Config{Entries: 1})
	if err == nil {
		err = probeNop(r)
		r.Close()
	}
	if err == nil {
		return nil
	}
	why := "a seccomp filter or the kernel's configuration"
	if v, rerr := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); rerr == nil && strings.TrimSpace(string(v)) != "0" {
		why = "sysctl kernel.io_uring_disabled=" + strings.TrimSpace(string(v))
	}
	return fmt.Errorf("%w by %s: %w", errIOUringRefused, why, err)
}

func probeNop(r *uring.Ring) error {
	sqe := r.GetSQE()
	if sqe == nil {
		return errors.New("no sqe")
	}
	sqe.PrepNop()
	if _, err := r.SubmitAndWait(1, time.Second); err != nil {
		return err
	}
	var cqe [1]uring.CQE
	if r.Reap(cqe[:]) != 1 || cqe[0].Res < 0 {
		return fmt.Errorf("io_uring no-op: result %d", cqe[0].Res)
	}
	return nil
}

// fallbackReason classifies a ublk start-up error.
func fallbackReason(err error) string {
	switch {
	case errors.Is(err, errIOUringRefused):
		return FallbackIOUringRefused
	case errors.Is(err, unix.ETIME):
		return FallbackUblkTimeout
	}
	return FallbackUblkFailed
}

var _ blockdev.Quarantiner = (*ublkBackend)(nil)
