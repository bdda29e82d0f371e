package ublk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cgroup"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// StateDir holds one State file per device (created if missing).
	StateDir string
	// Owner marks the devices of this plugin instance (kept by the
	// kernel in ublksrv_flags); the top bit must be set. Zero means
	// OwnerToken(StateDir), which depends on the path.
	Owner uint64
	// ZeroCopy chooses between zero copy and copy mode ("" = auto).
	ZeroCopy Mode
	// UserCopy chooses, for a new device without zero copy, between
	// USER_COPY (Linux 6.5+: the server copies each request's data
	// through /dev/ublkcN, large requests off its threads, and takes 1
	// MiB requests) and the kernel's copy mode ("" = auto). A re-adopted
	// device keeps the mode it was created with.
	UserCopy Mode
	// BatchIO chooses between batch commands (UBLK_F_BATCH_IO, Linux
	// 7.0+: requests fetched and committed in batches) and one command per
	// request ("" = off: it measured no faster, see the data plane's
	// queue_batch_linux.go). It applies to new devices; a re-adopted one
	// keeps the mode it was created with.
	BatchIO Mode
	// NowaitWrites decides QueueOptions.NowaitWrites (Queue's own value is
	// not used) ("" = auto): auto turns it on for a new device where the
	// backing file's filesystem refuses NOWAIT writes over a stale mtime
	// (StaleMtimeRefusesNowait, probed once per filesystem) and records
	// the choice in the device's State; on and off apply to every device,
	// re-adopted ones included.
	NowaitWrites Mode
	// CPUs is the CPU count the tuning policy uses (0 = runtime.NumCPU).
	CPUs int
	// MemoryBudget is the copy-mode buffer budget per device (0 = default).
	MemoryBudget int64
	// Queue is the queues' buffer, submission and wait policy.
	Queue QueueOptions
	// Threads is how many server threads serve every device's queues
	// (0 = one per CPU the process may use, at most its cgroup's CPU
	// limit rounded up: cpuLimit).
	Threads int
	// ThreadPolicy is how devices get server threads ("" = the default,
	// ThreadsPerDevice or ThreadsShared). With ThreadsPerDevice, Threads
	// bounds the pool (0 = DefaultDeviceThreads).
	ThreadPolicy ThreadPolicy
	// Thread sizes each server thread (zero: defaults).
	Thread ThreadConfig
	// Report, when set, is told what happens in the background with no
	// caller to return it to (a server thread that fails); its arguments
	// are klog.ErrorS's.
	Report func(err error, msg string, keysAndValues ...any)
	// FailUnservedAfter bounds how long a device the server keeps but
	// cannot serve holds its I/O: a started device carrying the owner
	// token that no readable state names (its state file lost, and no
	// volume's record agreeing with the kernel's view of it, see heal)
	// fails every request with EIO once it has been so this long
	// (unserved_linux.go). 0 holds its I/O until a process re-adopts it.
	FailUnservedAfter time.Duration
}

// ThreadPolicy is how a Server gives devices server threads.
type ThreadPolicy string

const (
	// ThreadsShared serves every device's queues on a fixed set of
	// threads, one per CPU (ServerConfig.Threads).
	ThreadsShared ThreadPolicy = "shared"
	// ThreadsPerDevice gives each device a thread of its own, up to
	// ServerConfig.Threads (then devices share): the kernel's scheduler
	// then keeps a quiet device's requests from waiting behind a busy
	// one's, as it does for loop devices' workers.
	ThreadsPerDevice ThreadPolicy = "device"
	// DefaultThreadPolicy is the policy of a ServerConfig that names none.
	DefaultThreadPolicy = ThreadsPerDevice
	// DefaultDeviceThreads bounds a per-device pool by default; the
	// process's pids limit may stop it earlier (roomForThread).
	DefaultDeviceThreads = 256
)

// roomForThread says whether a per-device pool may start another thread
// with headroom tasks left under the process's pids limit (-1: no limit;
// an error reading it: yes, as without a limit). A thread is a task and
// may start PerDeviceIOWQWorkers io-wq workers, tasks of the process too;
// pidsReserve stays for the Go runtime's own threads and the mkfs and
// mount children. Without room devices share threads: served all the
// same, with less isolation.
func roomForThread(headroom int64, err error) bool {
	return err != nil || headroom < 0 || headroom >= pidsReserve+1+dataplane.PerDeviceIOWQWorkers
}

// pidsReserve is the tasks a per-device pool leaves under the pids limit.
const pidsReserve = 16

// AttachSpec asks for a volume's device.
type AttachSpec struct {
	VolumeID  string
	File      string
	SizeBytes int64 // 0 = the file's size
	ReadOnly  bool
	// Queues and Depth override the tuning policy (0 = choose).
	Queues, Depth int
	// MaxIOBytes overrides the copy-mode request size limit (0 = default).
	MaxIOBytes uint32
	// Limits pace the device's reads and writes (zero: unlimited).
	Limits qos.Limits
	// KeepAllocated keeps the file's blocks allocated (a preallocated
	// volume): see Target.KeepAllocated.
	KeepAllocated bool
	// Null serves a null target instead of File (benchmarks only).
	Null bool
	// RecordedDev is the block device the volume's record names (where
	// its stable link leads), "" for none: with the volume's state file
	// unreadable, the device to re-adopt if the kernel agrees (heal).
	RecordedDev string
	// Changes are the ranges of the volume written since its last
	// snapshot that an earlier device recorded (the record its clean
	// detach left), and ChangesTrusted whether they are all of them:
	// a new device's change record starts from them (CutChanges). A
	// device the Server re-adopts starts from what the previous
	// process's Close handed over instead, or untrusted.
	Changes        []cbt.Extent
	ChangesTrusted bool
}

// Served describes a device the Server serves.
type Served struct {
	State
	Path string // /dev/ublkbN
}

// Server serves the ublk devices of one plugin instance: it creates them,
// records them in StateDir, re-adopts them after a restart and removes
// those whose volume is gone. It is safe for concurrent use on different
// volumes; callers serialise calls for the same volume.
type Server struct {
	cfg      ServerConfig
	ctl      *Control
	threads  *dataplane.Threads
	features uint64
	owner    uint64
	closed   atomic.Bool // Close began: thread ends are no failures; set under mu
	// heals counts the heals of failed threads under way (beginHeal);
	// Close cancels healCtx and waits for them.
	heals      sync.WaitGroup
	healCtx    context.Context
	healCancel context.CancelFunc

	mu   sync.Mutex // guards devs, stuck and gaveUp; never held across a control command
	devs map[string]*served
	// stuck are the devices this process started to re-adopt and could
	// neither finish nor let go of (their queues live on the shared
	// threads): they hold their I/O until the process restarts (Health).
	stuck map[string]*stuck
	// gaveUp are the volumes whose device's heal gave up (healVolume),
	// with why: Health fails for them; for the others, a device whose
	// server thread failed is being healed.
	gaveUp map[string]error
	// held are the devices kept but not served because their state is
	// lost and the volume's record disagrees with the kernel (Held).
	held map[string]error
	// failing are the devices the server keeps but cannot serve whose
	// I/O it fails (FailUnservedAfter), by device id.
	failing map[uint32]*failing
	// healMu serialises heal: two volumes whose records name one device
	// must not both re-adopt it.
	healMu sync.Mutex

	probeMu sync.Mutex
	nowait  map[uint64]bool // StaleMtimeRefusesNowait by filesystem (st_dev)
}

type served struct {
	// op serialises the operations on the volume's device (Detach,
	// Resize, SetLimits, Pause) with its in-process re-adoption after
	// its server thread failed (healThread), which replaces the served
	// with one of the same op: lockVolume.
	op   *sync.Mutex
	st   State
	dev  *Device
	lim  *qos.Limiter // shared by the device's queues
	file *os.File     // nil for the null target
	// recoveries counts the times this process re-adopted the device
	// through user recovery: from an earlier process at start, and each
	// time in the process after its server thread failed (rehome).
	recoveries uint64
	// ended holds the counters of the queues that rehome ended, so that
	// the volume's counters run on across a heal instead of restarting.
	ended QueueStats
	// changes is the device's change record (nil for a null target),
	// kept across its in-process re-adoptions (rehome).
	changes *cbt.Tracker
}

// NewServer opens the control device, checks the kernel (Features), and
// re-adopts or sweeps the devices recorded in StateDir (see Adopt).
func NewServer(ctx context.Context, cfg ServerConfig) (*Server, []error, error) {
	if cfg.CPUs <= 0 {
		cfg.CPUs = runtime.NumCPU()
	}
	for _, m := range []*Mode{&cfg.ZeroCopy, &cfg.UserCopy, &cfg.NowaitWrites} {
		if *m == "" {
			*m = ModeAuto
		}
	}
	if cfg.BatchIO == "" {
		cfg.BatchIO = ModeOff
	}
	if cfg.ThreadPolicy == "" && (cfg.Thread.Pin || cfg.Thread.Near) {
		// Threads pinned one per CPU are a shared pool's.
		cfg.ThreadPolicy = ThreadsShared
	}
	if cfg.ThreadPolicy == "" {
		cfg.ThreadPolicy = DefaultThreadPolicy
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create ublk state dir: %w", err)
	}
	ctl, err := OpenControl()
	if err != nil {
		return nil, nil, err
	}
	f, err := Features(ctl)
	if err != nil {
		ctl.Close()
		return nil, nil, err
	}
	if cfg.Owner == 0 {
		cfg.Owner = OwnerToken(cfg.StateDir)
	}
	s := &Server{cfg: cfg, ctl: ctl, features: f, owner: cfg.Owner, devs: map[string]*served{}}
	s.healCtx, s.healCancel = context.WithCancel(context.Background())
	switch cfg.ThreadPolicy {
	case ThreadsPerDevice:
		s.threads, err = dataplane.NewDeviceThreads(cmp.Or(cfg.Threads, DefaultDeviceThreads), cfg.Thread)
		if err == nil {
			pid := os.Getpid()
			s.threads.LimitGrowth(func() bool { return roomForThread(cgroup.PidsHeadroom(pid)) })
		}
	case ThreadsShared:
		n := cfg.Threads
		if n <= 0 {
			n = cpuThreads(usableCPUs(), cpuLimit(os.DirFS("/")))
		}
		s.threads, err = dataplane.NewThreads(n, cfg.Thread)
	default:
		err = fmt.Errorf("ublk thread policy %q: want %q or %q: %w", cfg.ThreadPolicy, ThreadsShared, ThreadsPerDevice, errInvalid)
	}
	if err != nil {
		ctl.Close()
		return nil, nil, err
	}
	errs := s.adopt(ctx)
	s.watchAll()
	if cfg.FailUnservedAfter > 0 {
		s.heals.Add(1)
		go s.watchUnserved(s.healCtx, cfg.FailUnservedAfter)
	}
	return s, errs, nil
}

// usableCPUs is how many CPUs the process may run on (its affinity mask).
func usableCPUs() int {
	if cpus := dataplane.AllowedCPUs(); len(cpus) > 0 {
		return len(cpus)
	}
	return runtime.NumCPU()
}

// Threads returns the server threads.
func (s *Server) Threads() *dataplane.Threads { return s.threads }

// Features returns the driver's UBLK_F_* flags.
func (s *Server) Features() uint64 { return s.features }

// Control returns the server's control connection.
func (s *Server) Control() *Control { return s.ctl }

func (s *Server) get(id string) *served {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devs[id]
}

func (s *Server) put(id string, sv *served) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv == nil {
		delete(s.devs, id)
	} else {
		s.devs[id] = sv
	}
}

// adoptRecorded re-adopts a device recorded for the volume but not served
// (its re-adoption at start failed), so that Attach never makes a second
// device for one volume. ok reports that it returned a device.
func (s *Server) adoptRecorded(ctx context.Context, spec AttachSpec) (Served, bool, error) {
	if spec.Null {
		return Served{}, false, nil
	}
	scan, err := loadStates(s.cfg.StateDir, false)
	if err != nil {
		return Served{}, false, fmt.Errorf("attach %s: %w", spec.VolumeID, err)
	}
	if err := s.checkUnreadable(spec.VolumeID, scan); err != nil {
		sv, err := s.heal(ctx, spec, err)
		if err != nil {
			return Served{}, false, err
		}
		if err := s.SetLimits(spec.VolumeID, spec.Limits); err != nil {
			return Served{}, false, err
		}
		return sv, true, nil
	}
	for _, st := range scan.states {
		if st.VolumeID != spec.VolumeID {
			continue
		}
		if st.File != spec.File {
			return Served{}, false, fmt.Errorf("attach %s: recorded for %s: %w", spec.VolumeID, st.File, os.ErrExist)
		}
		if err := s.adoptOne(ctx, st); err != nil {
			return Served{}, false, err
		}
		if sv := s.get(spec.VolumeID); sv != nil {
			if err := s.SetLimits(spec.VolumeID, spec.Limits); err != nil {
				return Served{}, false, err
			}
			return s.get(spec.VolumeID).info(), true, nil
		}
	}
	return Served{}, false, nil
}

// lockVolume locks the volume's served device against a concurrent
// re-adoption (healThread) and returns it with the unlock, or nil if the
// server does not serve the volume.
func (s *Server) lockVolume(id string) (*served, func()) {
	for {
		sv := s.get(id)
		if sv == nil {
			return nil, func() {}
		}
		sv.op.Lock()
		if s.get(id) == sv {
			return sv, sv.op.Unlock
		}
		sv.op.Unlock() // replaced meanwhile: lock its successor
	}
}

func (sv *served) info() Served { return Served{State: sv.st, Path: blockPath(sv.st.DevID)} }

// Detach deletes the volume's device and forgets it. Unknown volumes
// return nil.
func (s *Server) Detach(ctx context.Context, id string) error {
	_, err := s.DetachChanges(ctx, id)
	return err
}

// DetachChanges is Detach that also hands over the device's change record
// (see CutChanges) once its queues have ended, so that nothing written
// is missing from it: the record a clean detach leaves for the volume's
// next device or snapshot. A volume without a tracked device (unknown,
// or a device whose re-adoption failed) gives a nil Changes.
func (s *Server) DetachChanges(ctx context.Context, id string) (*Changes, error) {
	if err := validName(id); err != nil {
		return nil, err
	}
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil {
		return nil, s.detachRecorded(id)
	}
	if err := checkIdle(sv.dev.BlockPath()); err != nil {
		return nil, fmt.Errorf("detach %s: %w", id, err)
	}
	if err := sv.dev.Delete(ctx); err != nil {
		return nil, fmt.Errorf("detach %s: %w", id, err)
	}
	s.put(id, nil)
	if sv.file != nil {
		sv.file.Close()
	}
	var ch *Changes
	if sv.changes != nil {
		exts, trusted := sv.changes.Cut()
		ch = &Changes{Extents: exts, Trusted: trusted}
	}
	return ch, removeState(s.cfg.StateDir, id)
}

// detachRecorded removes a device that has a state file but is not served
// (its re-adoption failed). An unreadable state file of another volume
// does not block it; one of this volume does (checkUnreadable).
func (s *Server) detachRecorded(id string) error {
	scan, err := loadStates(s.cfg.StateDir, false)
	if err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	for _, st := range scan.states {
		if st.VolumeID == id {
			if err := s.deleteRecorded(st); err != nil {
				return fmt.Errorf("detach %s: %w", id, err)
			}
			s.unhold(id) // STOP_DEV ended its queues
			return nil
		}
	}
	if err := s.checkUnreadable(id, scan); err != nil {
		return fmt.Errorf("detach %w", err)
	}
	return nil
}

// Close stops serving without stopping the devices: they stay QUIESCED,
// their I/O held, until the next Server re-adopts them. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed.Store(true)
	s.mu.Unlock()
	// A heal under way re-adopts no more: it ends before the devices are
	// released here (one it left half done stays QUIESCED, or stuck).
	s.healCancel()
	s.heals.Wait()
	s.mu.Lock()
	devs := s.devs
	s.devs = map[string]*served{}
	s.mu.Unlock()
	var errs []error
	for id, sv := range devs {
		if sv.file == nil {
			// Null devices are never re-adopted: remove them.
			errs = append(errs, sv.dev.Delete(context.Background()))
			delete(devs, id)
		}
	}
	if p := s.Threads(); p != nil {
		// Closing the rings cancels every parked command at once: the
		// devices stay QUIESCED, their I/O held.
		errs = append(errs, p.Close())
	}
	errs = append(errs, s.closeFailing()...)
	s.mu.Lock()
	stuck := s.stuck
	s.stuck = nil
	s.mu.Unlock()
	for _, st := range stuck {
		errs = append(errs, st.release())
	}
	// No thread can mark a record any more, unless one failed to end.
	// (errs holds the nils of what succeeded.)
	handover := errors.Join(errs...) == nil
	for _, sv := range devs {
		errs = append(errs, sv.dev.Release(context.Background()))
		if handover {
			// Stamped from the open file (handOver), so before it closes.
			errs = append(errs, s.handOver(sv))
		}
		sv.file.Close()
	}
	return errors.Join(append(errs, s.ctl.Close())...)
}

// checkIdle fails with an error wrapping unix.EBUSY when the block device
// is mounted or held open exclusively: deleting it then would leave the
// holder with a dead device (and DEL_DEV would wait for it).
func checkIdle(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s is in use: %w", path, err)
	}
	if err == nil {
		unix.Close(fd)
	}
	return nil
}

// DeviceSize returns the size the kernel reports for /dev/ublkbN.
func DeviceSize(devID uint32) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/sys/block/ublkb%d/size", devID))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse size of ublkb%d: %w", devID, err)
	}
	return n << 9, nil
}
