package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filelock"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/metrics"
	"github.com/fastblk/csi-fastblk/pkg/nodeloss"
	"github.com/fastblk/csi-fastblk/pkg/nodereport"
	"github.com/fastblk/csi-fastblk/pkg/snapshotowner"
)

type serveConfig struct {
	endpoint       string
	backend        string
	metricsAddress string
	healthAddress  string
	registration   registrationConfig
	statusAddress  string
	exposeStatus   bool
	reconcileRetry time.Duration
	labelContents  bool
	kubeReport     bool
	classes        classFlags
	labelGroups    bool
	driver         driver.Config
	peer           peerConfig
	store          store.Config
	devices        backend.Config
}

func serveFlags(fs *flag.FlagSet) *serveConfig {
	host, _ := os.Hostname()
	c := &serveConfig{}
	fs.StringVar(&c.endpoint, "endpoint", "unix:///run/csi-fastblk/csi.sock", "CSI endpoint: unix:///path or tcp://host:port")
	fs.StringVar(&c.driver.NodeID, "node-id", host, "this node's ID (default: the hostname)")
	fs.StringVar(&c.driver.Name, "driver-name", "fastblk.csi.io", "CSI driver name")
	fs.StringVar(&c.store.Dir, "data-dir", "/var/lib/csi-fastblk", "directory holding volume files and metadata")
	fs.Float64Var(&c.store.OverProvisionRatio, "over-provision-ratio", 1.0, "capacity reported to the scheduler = free space × ratio (≥ 1)")
	fs.Func("reserve", "free space of the data directory's filesystem never handed out to volumes: bytes, with Ki/Mi/Gi/k/M/G, "+
		"or a percentage of the filesystem's size such as 10% (subtracted from the capacity reported to the scheduler and "+
		"checked by every create, clone, snapshot and expansion; default 0)",
		func(s string) (err error) {
			c.store.ReserveBytes, c.store.ReserveRatio, err = driver.ParseReserve(s)
			return err
		})
	fs.Var(&c.classes, "device-class", "a device class of this node, a data directory of its own that StorageClasses choose with the parameter "+
		driver.ParamDeviceClass+": name=NAME,path=PATH[,reserve=SIZE|N%][,over-provision-ratio=R] (repeat for more; --data-dir is the class "+
		"\"default\"). The path must exist and, on the root filesystem (that of / or of --registration-dir), have a reserve; a class that fails "+
		"its checks is not served, and the others are")
	fs.Int64Var(&c.driver.MaxVolumesPerNode, "max-volumes-per-node", 64, "volumes in use by pods on this node at once, reported to the kubelet as its attach limit for the scheduler (0 = no limit)")
	fs.StringVar(&c.backend, "backend", "auto", "device backend: auto (ublk where it works, loading ublk_drv where the kernel has it but did not load it; "+
		"else loop, saying why), ublk or loop")
	fs.StringVar(&c.devices.DevDir, "dev-dir", "/dev/fastblk", "directory for stable device links <dev-dir>/<volume-id>")
	fs.IntVar(&c.devices.Tuning.Queues, "queues", 0, "default ublk queues per device (0 = from the node's CPUs)")
	fs.IntVar(&c.devices.Tuning.QueueDepth, "queue-depth", 0, "default ublk queue depth (0 = from the node's CPUs and memory)")
	fs.Func("max-io-size", "default largest ublk request in copy mode, in bytes or with Ki/Mi, a multiple of 4Ki up to 1Mi "+
		"(default 1Mi with user copy, 128Ki in copy mode, where each queue slot has a buffer this big within a 16 MiB budget per volume; zero copy always takes 1Mi)",
		func(s string) (err error) {
			c.devices.Tuning.MaxIOBytes, err = driver.ParseMaxIOSize(s)
			return err
		})
	fs.DurationVar(&c.devices.Poll, "ublk-poll", time.Millisecond,
		"longest a ublk server thread with few requests in service polls for completions before sleeping; it polls for twice its usual wait within this (0 = never poll, saves CPU)")
	c.devices.FailUnservedAfter = defaultFailUnservedAfter
	fs.Func("ublk-fail-unserved-after", "how long a ublk device the plugin keeps but cannot re-adopt (no readable record names it) holds its I/O "+
		"before the plugin fails it with EIO (0 = hold it until a plugin re-adopts it; default 1m)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err == nil && d < 0 {
			err = fmt.Errorf("%v is negative", d)
		}
		c.devices.FailUnservedAfter = d
		return err
	})
	fs.IntVar(&c.devices.Threads, "ublk-threads", 0, "ublk server threads: with --ublk-thread-policy shared, how many serve every device (0 = one per CPU the plugin may use, at most its CPU limit); with device, the most started before devices share (0 = 256, fewer under a pids limit)")
	fs.StringVar(&c.devices.ThreadPolicy, "ublk-thread-policy", "", "how devices get ublk server threads: device (the default: each device a thread of its own, as each loop device has its worker) or shared (a few threads serve every device)")
	fs.IntVar(&c.devices.ThreadTags, "ublk-thread-tags", 0, "benchmarks only: most tags each ublk server thread serves, sizing its rings (0 = default)")
	fs.IntVar(&c.devices.PollInFlight, "ublk-poll-inflight", 0, "benchmarks only: most requests in service with which a ublk server thread still polls before sleeping (0 = default)")
	fs.IntVar(&c.devices.DiskSlots, "ublk-disk-slots", 0, "benchmarks only: most reads and writes each ublk server thread keeps in flight on the backing disk (0 = no bound, -1 = its share of the disk's request slots)")
	fs.Func("ublk-iowq-workers", "benchmarks only: cap on each ublk server thread's io-wq workers (0 = 4 with --ublk-thread-policy device; shared: the kernel's cap plus the depth of the deepest queue it serves)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		c.devices.IOWQWorkers = uint32(n)
		return err
	})
	fs.BoolVar(&c.devices.NearQueues, "ublk-near-queues", false, "benchmarks only: pin ublk server threads one per CPU and place each device queue on the thread of a CPU the kernel maps to it")
	fs.BoolVar(&c.devices.PinThreads, "ublk-pin-threads", false, "benchmarks only: pin ublk server thread i to the i-th CPU the plugin may use")
	fs.StringVar(&c.devices.ZeroCopy, "ublk-zero-copy", "auto", "benchmarks only: ublk zero copy on new devices: auto (where the kernel offers it), on or off")
	fs.StringVar(&c.devices.UserCopy, "ublk-user-copy", "auto", "benchmarks only: new ublk devices without zero copy copy through the char device (USER_COPY, Linux 6.5+): auto (where the kernel offers it), on or off")
	// Off by default: beside busy neighbours on the host's disk the
	// kernel's hand-off of the writes to io-wq gave them 9-29% more IOPS
	// at less CPU per I/O on 7.3, and a lone volume's writes were even
	// within the noise; with the data disk in RAM, NOWAIT kept the quiet
	// volume closer to loop (docs/benchmark-studies.md, "RWF_NOWAIT
	// writes beside busy neighbours").
	c.devices.NowaitWrites = string(ublk.ModeOff)
	fs.Func("ublk-nowait-writes", "benchmarks only: ublk devices keep their backing file's mtime current from the server thread and send writes with RWF_NOWAIT: off (io_uring's hand-off of the writes that would block; default), auto (where the filesystem refuses NOWAIT writes over a stale mtime) or on",
		func(s string) error {
			_, err := ublk.ParseMode("--ublk-nowait-writes", s)
			c.devices.NowaitWrites = s
			return err
		})
	ablateFlag(fs, &c.devices)
	fs.Func("ublk-batch-io", "fetch and commit ublk requests in batches (UBLK_F_BATCH_IO, Linux 7.0+) on new devices: off, auto (where the kernel offers it) or on (default off)",
		func(s string) error {
			_, err := ublk.ParseMode("--ublk-batch-io", s)
			c.devices.BatchIO = s
			return err
		})
	fs.Func("copy-budget", "share of an in-use volume's IOPS this node's background copies (restores, clones, streams to and from "+
		"other nodes) may cost it, from 0.01 to 0.9: a copy that costs more runs more slowly, down to a tenth of its rate (default 0.2; "+
		"0 paces copies by their rates alone)", func(s string) error {
		v, err := strconv.ParseFloat(s, 64)
		switch {
		case err != nil:
			return err
		case v == 0:
			c.driver.CopyBudget = -1
		case v < 0.01 || v > 0.9:
			return fmt.Errorf("%v: want 0 (off) or from 0.01 to 0.9", v)
		default:
			c.driver.CopyBudget = v
		}
		return nil
	})
	fs.BoolVar(&c.driver.ControllerExpansion, "controller-expansion", false,
		"advertise ControllerExpandVolume (in a cluster only with --peer-address: external-resizer has no per-node mode, so its leader's plugin forwards other nodes' volumes to them)")
	peerFlags(fs, &c.peer)
	fs.StringVar(&c.metricsAddress, "metrics-address", ":9811", "address for /metrics and /healthz (empty disables)")
	fs.StringVar(&c.healthAddress, "health-address", "", "address for /healthz alone, for the kubelet's liveness probe (empty disables; /healthz is on --metrics-address too)")
	fs.StringVar(&c.registration.dir, "registration-dir", "",
		"register with the kubelet: the kubelet's plugin registration directory (<kubelet dir>/plugins_registry), where the plugin serves <driver name>-reg.sock (empty: no registration)")
	fs.StringVar(&c.registration.path, "kubelet-registration-path", "",
		"the CSI endpoint's socket path as the kubelet sees it on the node (default: the --endpoint path)")
	fs.StringVar(&c.statusAddress, "status-address", "",
		"local address for /status, which names volumes and paths: unix:///path or host:port "+
			"(default: status.sock beside a unix CSI endpoint's socket; none disables)")
	fs.BoolVar(&c.exposeStatus, "expose-status", false, "also serve /status on --metrics-address, to anyone who can reach it")
	fs.BoolVar(&c.labelContents, "label-snapshot-contents", false,
		"give VolumeSnapshotContents made by hand for this node's snapshots, and those of the members of this node's group snapshots, the label "+
			snapshotowner.ManagedBy+" with this node's ID (which must be its node name), so that a csi-snapshotter in --node-deployment mode handles them; needs the API server")
	fs.BoolVar(&c.labelGroups, "label-group-snapshots", false,
		"give the VolumeGroupSnapshotContents of this node's volumes, and their VolumeGroupSnapshotClasses in turn, the label "+
			snapshotowner.ManagedBy+" with this node's ID, so that a csi-snapshotter in --node-deployment mode makes and deletes its group snapshots; needs the API server")
	fs.BoolVar(&c.kubeReport, "kube-report", false,
		"tell the cluster what this node serves: label its Node "+nodereport.BackendLabel("<driver>")+"=ublk|loop, annotate it with "+
			nodereport.ReasonAnnotation("<driver>")+" and post a Warning event when it serves loop for want of ublk, and post events on the "+
			"StorageClasses (and their pending claims) it gives no capacity, saying why; needs the API server (--node-id must be the node's name)")
	fs.DurationVar(&c.reconcileRetry, "reconcile-retry", 30*time.Second,
		"how often to retry restoring staged volumes whose devices could not be restored at start, for example because the backing file system was not yet mounted (0 = never)")
	klog.InitFlags(fs) // -v and klog's other flags
	return c
}

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := serveFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	defer klog.Flush()
	cfg.driver.Version = version
	cfg.driver.Tuning = cfg.devices.Tuning
	cfg.devices.DataDir = cfg.store.Dir
	return serve(ctx, cfg)
}

// serve wires config → store → backend → driver → gRPC server and runs
// until ctx is cancelled (SIGTERM), then shuts down gracefully. Devices stay
// attached: a restarted plugin adopts them.
func serve(ctx context.Context, cfg *serveConfig) error {
	st, err := store.Open(cfg.store)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	classes, down, err := openClasses(st.Dir(), cfg.classes, rootRefs(cfg))
	if err != nil {
		return err
	}
	thawAbandoned(st.Dir())
	for _, c := range classes {
		thawAbandoned(c.st.Dir())
		cfg.devices.ClassDirs = append(cfg.devices.ClassDirs, c.st.Dir())
	}
	cfg.devices.AdoptUnmarked = true // once per data directory: the upgrade
	cfg.devices.Report = klog.ErrorS
	hadUblk := kernel.ModuleLoaded("ublk_drv")
	be, fallback, err := backend.Select(cfg.backend, cfg.devices)
	if err != nil {
		return fmt.Errorf("backend %s: %w", cfg.backend, err)
	}
	if !hadUblk && kernel.ModuleLoaded("ublk_drv") {
		klog.InfoS("loaded the kernel module", "module", "ublk_drv")
	}
	// The backend is not closed at exit: its devices outlive the process
	// and the next plugin adopts them, exactly as after a crash. Closing
	// the ublk server first (its live threads' rings, then each device)
	// now and then left the next plugin's START_USER_RECOVERY hanging on
	// Linux 6.12 (TestUpgradeStall; how often: docs/benchmark-studies.md,
	// "Figures behind code comments"), where exiting as a crash never has
	// (TestCrashStall and the kill -9 recovery tests); docs/upgrades.md.
	// What the exit does instead is hand each device's change record over
	// with its I/O held (Driver.HandOver), and leave the rest to the
	// kernel as a crash does.
	var startup metrics.Startup
	if fallback != nil {
		klog.ErrorS(fallback.Err, "ublk cannot serve on this node; serving volumes with loop devices",
			"backend", cfg.backend, "reason", fallback.Reason, "metric", "fastblk_backend_fallback")
		startup.BackendFallback = fallback.Reason
		cfg.driver.LoopBecause = fallback.Reason + ": " + fallback.Err.Error()
	}
	if err := cfg.peer.check(); err != nil {
		return err
	}
	var peers *peerChannel
	var api dynamic.Interface
	if cfg.peer.address != "" || cfg.labelContents || cfg.labelGroups || cfg.kubeReport {
		if api, err = kubeapi.InCluster("plugin"); err != nil {
			return fmt.Errorf("kubernetes API (for the peer channel, the snapshot labeller and --kube-report): %w", err)
		}
	}
	if be.Name() != "loop" {
		// Volumes staged through loop devices before a restart onto
		// ublk keep them until they are unstaged.
		if lb, err := backend.New("loop", cfg.devices); err == nil {
			cfg.driver.FormerBackends = []blockdev.Backend{lb}
		}
	}
	if cfg.kubeReport {
		rep := &nodereport.Reporter{API: api, Driver: cfg.driver.Name, Node: cfg.driver.NodeID}
		rep.Start(ctx)
		reason, why := "", ""
		if fallback != nil {
			reason, why = fallback.Reason, fallback.Err.Error()
		}
		rep.Backend(be.Name(), reason, why)
		cfg.driver.NoCapacity = rep
	}
	if cfg.peer.address != "" {
		peers = &peerChannel{}
		cfg.driver.Peers = peers
		cfg.driver.NoPeerData = !cfg.peer.serveData
		cfg.driver.PeerAuthz = newPeerAuthz(api, cfg.driver.Name)
		cfg.driver.Handoffs = cfg.peer.handoffs
		cfg.driver.PeerMetadata = cfg.peer.serveMetadata
	}
	drv, err := driver.New(cfg.driver, st, be)
	if err != nil {
		return err
	}
	if err := addClasses(drv, classes, down); err != nil {
		return err
	}
	logStartup(cfg, drv, st, be)
	if err := drv.Reconcile(ctx); err != nil {
		if cfg.reconcileRetry > 0 {
			klog.ErrorS(err, "some staged volumes could not be restored; retrying", "every", cfg.reconcileRetry)
			go retryReconcile(ctx, drv, cfg.reconcileRetry)
		} else {
			klog.ErrorS(err, "some staged volumes could not be restored")
		}
	}
	release, err := lockEndpoint(cfg.endpoint)
	if err != nil {
		return err
	}
	defer release()
	reg, err := newRegistration(cfg, drv)
	if err != nil {
		return err
	}
	go drv.WatchIOErrors(ctx, ioWatchInterval)
	if api != nil {
		go reportKept(ctx, api, drv, cfg.driver.Name, cfg.driver.NodeID)
	}
	go drv.ReapHandoffs(ctx)
	if cfg.labelContents {
		l := &snapshotowner.Labeler{API: api, Driver: cfg.driver.Name, Node: cfg.driver.NodeID, Holds: drv.HoldsSnapshot,
			HoldsGroup: drv.HoldsGroupSnapshot}
		go l.Run(ctx, contentLabelInterval)
	}
	if cfg.labelGroups {
		g := &snapshotowner.Groups{API: api, Driver: cfg.driver.Name, Node: cfg.driver.NodeID,
			HoldsVolume: drv.HoldsVolume, HoldsGroup: drv.HoldsGroupSnapshot}
		go g.Run(ctx, groupLabelInterval)
	}
	lis, err := driver.Listen(cfg.endpoint)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	stopMetrics, err := startMetrics(cfg, drv.Status, startup)
	if err != nil {
		lis.Close()
		return err
	}
	defer stopMetrics()
	klog.InfoS("serving", "endpoint", cfg.endpoint)
	err = serveRegistered(ctx, drv, reg, func(ctx context.Context) error {
		if peers == nil {
			return drv.Serve(ctx, lis)
		}
		return serveWithPeers(ctx, cfg, api, drv, peers, lis)
	})
	klog.InfoS("stopped")
	handOver(drv)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// defaultFailUnservedAfter is --ublk-fail-unserved-after's default: long
// enough for a start and two reconcile retries to re-adopt a device whose
// record is repaired meanwhile, short enough that its writers get EIO
// before the kernel's hung task warnings (120 s).
const defaultFailUnservedAfter = 60 * time.Second

// handOverWait bounds the hand-over of the devices' change records at
// exit (the kubelet kills the container 30 s after SIGTERM, the CSI
// server's graceful stop included).
const handOverWait = 10 * time.Second

// handOver hands every device's change record over to the next plugin as
// this one stops (Driver.HandOver): the first delta of each volume after
// a rollout still comes from the records.
func handOver(drv *driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), handOverWait)
	defer cancel()
	start := time.Now()
	if err := drv.HandOver(ctx); err != nil {
		klog.ErrorS(err, "some change records were not handed over: the first delta of their volumes after the restart compares snapshot files")
		return
	}
	klog.InfoS("change records handed over", "took", time.Since(start))
}

// serveWithPeers serves the CSI endpoint and the peer channel until ctx
// ends or either fails.
func serveWithPeers(ctx context.Context, cfg *serveConfig, api dynamic.Interface, drv *driver.Driver, peers *peerChannel, lis net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peerErr := make(chan error, 1)
	go func() {
		err := runPeer(ctx, cfg.peer, api, cfg.driver.NodeID, drv, peers)
		if err != nil {
			klog.ErrorS(err, "peer channel ended; exiting so that the container restarts")
			cancel()
		}
		peerErr <- err
	}()
	err := drv.Serve(ctx, lis)
	cancel()
	return errors.Join(err, <-peerErr)
}

// lockEndpoint keeps a second plugin off a unix endpoint this process
// serves: it holds an exclusive lock on "<socket>.lock" until release (or
// the process's end). Two plugins on one node, for example two node
// groups' DaemonSets whose selectors both match it, would otherwise take
// the socket from each other and serve the same devices; the second now
// stops at start, saying why. Other endpoints need no lock.
func lockEndpoint(endpoint string) (release func(), err error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return func() {}, nil
	}
	lock := path + ".lock"
	if err := os.MkdirAll(filepath.Dir(lock), 0o750); err != nil {
		return nil, fmt.Errorf("lock endpoint: %w", err)
	}
	release, err = filelock.Lock(lock)
	if errors.Is(err, blockdev.ErrBusy) {
		return nil, fmt.Errorf("endpoint %s is served by another csi-fastblk (it holds %s): one plugin per node "+
			"(with node groups, a node must match only one group's nodeSelector)", endpoint, lock)
	}
	if err != nil {
		return nil, fmt.Errorf("lock endpoint: %w", err)
	}
	return release, nil
}

// thawAbandoned thaws the filesystems an earlier run froze for a snapshot or
// clone and was killed before thawing: their pods' writes hang until then.
// What cannot be thawed is logged and kept for the next start; serving goes
// on, since the other volumes need it.
func thawAbandoned(dataDir string) {
	thawed, err := quiesce.ThawAbandoned(dataDir)
	for _, r := range thawed {
		klog.InfoS("thawed a filesystem a previous run left frozen", "volumeID", r.VolumeID,
			"mountPath", r.MountPath, "frozenAt", r.FrozenAt)
	}
	if err != nil {
		klog.ErrorS(err, "cannot thaw every filesystem a previous run left frozen; their writes hang until thawed (fsfreeze -u <mount>)")
	}
}

// ioWatchInterval is how often the plugin looks for volumes whose I/O
// failed and for a full data directory (Driver.WatchIOErrors): a statfs
// and the backend's counters, nothing that touches the disk.
const ioWatchInterval = 2 * time.Second

// contentLabelInterval is how often the plugin looks for hand-made
// snapshot contents to label: a LIST of the unlabelled ones only.
const contentLabelInterval = 10 * time.Second

// reportKept says once, at start, which of this node's volumes it keeps
// though no claim uses them (pkg/nodeloss.Kept: a node that comes back
// after its Node object was deleted), retrying until the API server
// answers.
func reportKept(ctx context.Context, api dynamic.Interface, drv *driver.Driver, driverName, node string) {
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		kept, err := nodeloss.Kept(ctx, api, driverName, node, drv.VolumeIDs())
		if err == nil {
			drv.SetKept(kept)
			return
		}
		klog.ErrorS(err, "cannot tell which volumes this node keeps without a claim; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// groupLabelInterval is how often the plugin looks again at the group
// snapshot objects it watches, besides each change: a class changes hands
// after a time (snapshotowner.Groups), and a node waiting for one takes it
// within this of its release. A pass reads the watches' caches only.
const groupLabelInterval = 2 * time.Second

// retryReconcile calls Reconcile every interval until it succeeds or ctx
// ends.
func retryReconcile(ctx context.Context, drv *driver.Driver, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := drv.Reconcile(ctx)
		if err == nil {
			klog.InfoS("all staged volumes restored")
			return
		}
		klog.ErrorS(err, "some staged volumes could not be restored; retrying", "every", interval)
	}
}

// quarantineCause says why the record at path was set aside: what q
// recorded, else the start-up error of the backend that names the file,
// else that an earlier start set it aside.
func quarantineCause(q any, path string, startupErrs []error) error {
	if c, ok := q.(interface{ QuarantineCause(string) error }); ok {
		if err := c.QuarantineCause(path); err != nil {
			return err
		}
	}
	for _, err := range startupErrs {
		if strings.Contains(err.Error(), filepath.Base(path)) {
			return err
		}
	}
	return errors.New("set aside by an earlier start (its cause was logged then)")
}

func logStartup(cfg *serveConfig, drv *driver.Driver, st *store.Store, be blockdev.Backend) {
	klog.InfoS("csi-fastblk starting", "version", version, "driver", cfg.driver.Name, "nodeID", cfg.driver.NodeID,
		"kernel", kernel.Release(), "backend", be.Name(), "dataDir", cfg.store.Dir, "reserveBytes", cfg.store.ReserveBytes, "reserveRatio", cfg.store.ReserveRatio)
	for _, c := range drv.ClassStatus() {
		if c.Unavailable {
			klog.ErrorS(errors.New(c.Error), "device class unavailable: its volumes are out of service, their files kept, until it is served again",
				"deviceClass", c.Name, "path", c.Path, "volumes", c.Stranded)
			continue
		}
		klog.InfoS("device class", "deviceClass", c.Name, "path", c.Path, "capacityAvailable", c.CapacityAvailable,
			"capacityTotal", c.CapacityTotal, "capacityErr", c.Error, "volumes", c.Volumes, "snapshots", c.Snapshots)
	}
	if f, ok := be.(interface{ Features() uint64 }); ok {
		klog.InfoS("ublk driver features", "flags", fmt.Sprintf("%#x", f.Features()))
	}
	var startupErrs []error
	if r, ok := be.(interface{ StartupErrors() []error }); ok {
		startupErrs = r.StartupErrors()
	}
	quarantiners := []any{be}
	for _, st := range drv.Stores() {
		quarantiners = append(quarantiners, st)
	}
	for _, q := range quarantiners {
		if q, ok := q.(blockdev.Quarantiner); ok {
			for _, p := range q.Quarantined() {
				klog.ErrorS(quarantineCause(q, p, startupErrs),
					"unreadable record set aside: its volume is out of service until an operator restores or removes it", "path", p)
			}
		}
	}
	for _, err := range startupErrs {
		klog.ErrorS(err, "device recovery at start-up")
	}
}

// rootRefs are paths on the node's root filesystem, where a device class
// needs a reserve: / and, in a cluster, the kubelet's plugin registration
// directory (the kubelet's own filesystem, which its evictions watch).
func rootRefs(cfg *serveConfig) []string {
	refs := []string{"/"}
	if cfg.registration.dir != "" {
		refs = append(refs, cfg.registration.dir)
	}
	return refs
}

// addClasses gives the driver the device classes: those opened, and those
// it cannot serve. A class whose name the driver refuses (too long for
// this node's volume IDs) is one it cannot serve.
func addClasses(drv *driver.Driver, open []openClass, down []downClass) error {
	for _, c := range open {
		if err := drv.AddDeviceClass(c.name, c.st); err != nil {
			c.st.Close()
			vols, _ := devclass.Volumes(c.st.Dir())
			down = append(down, downClass{name: c.name, path: c.st.Dir(), volumes: vols, why: err})
		}
	}
	for _, c := range down {
		if err := drv.AddUnavailableClass(c.name, c.path, c.volumes, c.why); err != nil {
			return fmt.Errorf("device class %s: %w", c.name, err)
		}
	}
	return nil
}
