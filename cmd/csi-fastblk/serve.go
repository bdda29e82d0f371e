package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/metrics"
)

type serveConfig struct {
	endpoint       string
	backend        string
	metricsAddress string
	reconcileRetry time.Duration
	driver         driver.Config
	store          blockdev.StoreConfig
	devices        blockdev.BackendConfig
}

func serveFlags(fs *flag.FlagSet) *serveConfig {
	host, _ := os.Hostname()
	c := &serveConfig{}
	fs.StringVar(&c.endpoint, "endpoint", "unix:///run/csi-fastblk/csi.sock", "CSI endpoint: unix:///path or tcp://host:port")
	fs.StringVar(&c.driver.NodeID, "node-id", host, "this node's ID (default: the hostname)")
	fs.StringVar(&c.driver.Name, "driver-name", "fastblk.csi.io", "CSI driver name")
	fs.StringVar(&c.store.Dir, "data-dir", "/var/lib/csi-fastblk", "directory holding volume files and metadata")
	fs.Float64Var(&c.store.OverProvisionRatio, "over-provision-ratio", 1.0, "capacity reported to the scheduler = free space × ratio (≥ 1)")
	fs.Int64Var(&c.driver.MaxVolumesPerNode, "max-volumes-per-node", 64, "volumes this node accepts (0 = no limit)")
	fs.StringVar(&c.backend, "backend", "auto", "device backend: auto (ublk when /dev/ublk-control exists and works, else loop, saying why), ublk or loop")
	fs.StringVar(&c.devices.DevDir, "dev-dir", "/dev/fastblk", "directory for stable device links <dev-dir>/<volume-id>")
	fs.IntVar(&c.devices.Tuning.Queues, "queues", 0, "default ublk queues per device (0 = from the node's CPUs)")
	fs.IntVar(&c.devices.Tuning.QueueDepth, "queue-depth", 0, "default ublk queue depth (0 = from the node's CPUs and memory)")
	fs.Func("max-io-size", "default largest ublk request in copy mode, in bytes or with Ki/Mi, a multiple of 4Ki up to 1Mi "+
		"(default 128Ki; each queue slot has a buffer this big, within a 16 MiB budget per volume; zero copy always takes 1Mi)",
		func(s string) (err error) {
			c.devices.Tuning.MaxIOBytes, err = driver.ParseMaxIOSize(s)
			return err
		})
	fs.DurationVar(&c.devices.Poll, "ublk-poll", time.Millisecond,
		"longest a ublk queue thread with few requests in service polls for completions before sleeping; it polls for twice its usual wait within this (0 = never poll, saves CPU)")
	fs.Func("ublk-batch-io", "fetch and commit ublk requests in batches (UBLK_F_BATCH_IO, Linux 7.0+) on new devices: off, auto (where the kernel offers it) or on (default off)",
		func(s string) error {
			_, err := ublk.ParseMode("--ublk-batch-io", s)
			c.devices.BatchIO = s
			return err
		})
	fs.BoolVar(&c.driver.ControllerExpansion, "controller-expansion", false,
		"advertise ControllerExpandVolume (leave off in clusters: external-resizer has no per-node mode, so nodes grow their own volumes in NodeExpandVolume)")
	fs.StringVar(&c.metricsAddress, "metrics-address", ":9811", "address for /metrics and /status (empty disables)")
	fs.DurationVar(&c.reconcileRetry, "reconcile-retry", 30*time.Second,
		"how often to retry restoring staged volumes whose devices could not be restored at start, for example held back by the pids limit (0 = never)")
	return c
}

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := serveFlags(fs)
	klog.InitFlags(fs)
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
	store, err := blockdev.OpenStore(cfg.store)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	backend, fallback, err := blockdev.SelectBackend(cfg.backend, cfg.devices)
	if err != nil {
		return fmt.Errorf("backend %s: %w", cfg.backend, err)
	}
	defer backend.Close()
	var startup metrics.Startup
	if fallback != nil {
		klog.ErrorS(fallback.Err, "ublk does not work on this node; serving volumes with loop devices",
			"backend", cfg.backend, "reason", fallback.Reason, "metric", "fastblk_backend_fallback")
		startup.BackendFallback = fallback.Reason
	}
	if backend.Name() == "ublk" {
		limitVolumesToPids(&cfg.driver, cfg.devices.Tuning.Queues)
	}
	drv, err := driver.New(cfg.driver, store, backend)
	if err != nil {
		return err
	}
	logStartup(cfg, store, backend)
	if err := drv.Reconcile(ctx); err != nil {
		if cfg.reconcileRetry > 0 {
			klog.ErrorS(err, "some staged volumes could not be restored; retrying", "every", cfg.reconcileRetry)
			go retryReconcile(ctx, drv, cfg.reconcileRetry)
		} else {
			klog.ErrorS(err, "some staged volumes could not be restored")
		}
	}
	lis, err := driver.Listen(cfg.endpoint)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	stopMetrics, err := startMetrics(ctx, cfg.metricsAddress, drv, startup)
	if err != nil {
		lis.Close()
		return err
	}
	defer stopMetrics()
	klog.InfoS("serving", "endpoint", cfg.endpoint)
	err = drv.Serve(ctx, lis)
	klog.InfoS("stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

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

// limitVolumesToPids lowers the volume count the node reports (NodeGetInfo,
// which the scheduler honours) to what the plugin's pids limit can hold:
// each ublk volume's queues are threads of this process, and a thread the
// kernel refuses to create is a fatal error in Go, which would take every
// volume's server down at once.
func limitVolumesToPids(d *driver.Config, queues int) {
	limit, err := blockdev.PidsLimit(os.Getpid())
	if err != nil {
		klog.ErrorS(err, "cannot read the pids limit; max volumes per node unchanged", "maxVolumesPerNode", d.MaxVolumesPerNode)
		return
	}
	if queues == 0 {
		queues = ublk.DefaultQueues(runtime.NumCPU())
	}
	threads := threadCount()
	fit, ok := volumesWithinPids(limit, threads, queues)
	if !ok || (d.MaxVolumesPerNode != 0 && d.MaxVolumesPerNode <= fit) {
		return
	}
	klog.InfoS("pids limit: lowering max volumes per node", "pidsMax", limit, "threads", threads,
		"threadsPerVolume", queues*ublk.ThreadsPerQueue, "maxVolumesPerNode", d.MaxVolumesPerNode, "lowered", fit,
		"fix", "raise the pod's pids limit, or set --queues lower")
	d.MaxVolumesPerNode = fit
}

// pidsReserve is the threads kept free for everything but the queues: the
// Go runtime, gRPC, metrics, mkfs and mount children.
const pidsReserve = 64

// volumesWithinPids is how many volumes of queues queues fit in a pids
// limit when threads are already in use; false when there is no limit.
// It is at least 1, so that a tight limit still serves a volume.
func volumesWithinPids(limit, threads int64, queues int) (int64, bool) {
	if limit < 0 {
		return 0, false
	}
	per := int64(queues * ublk.ThreadsPerQueue)
	return max(1, (limit-threads-pidsReserve)/per), true
}

// threadCount is this process's current thread count (0 if unknown).
func threadCount() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func logStartup(cfg *serveConfig, store *blockdev.Store, backend blockdev.Backend) {
	kernel := blockdev.KernelRelease()
	avail, total, err := store.Capacity()
	klog.InfoS("csi-fastblk starting", "version", version, "driver", cfg.driver.Name, "nodeID", cfg.driver.NodeID,
		"kernel", kernel, "backend", backend.Name(), "dataDir", cfg.store.Dir,
		"capacityAvailable", avail, "capacityTotal", total, "capacityErr", err,
		"volumes", len(store.Volumes()), "snapshots", len(store.Snapshots()))
	if f, ok := backend.(interface{ Features() uint64 }); ok {
		klog.InfoS("ublk driver features", "flags", fmt.Sprintf("%#x", f.Features()))
	}
	if r, ok := backend.(interface{ StartupErrors() []error }); ok {
		for _, err := range r.StartupErrors() {
			klog.ErrorS(err, "device recovery at start-up")
		}
	}
}
