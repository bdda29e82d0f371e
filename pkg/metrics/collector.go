package metrics

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

// StatusFunc returns the node's current status.
type StatusFunc func(ctx context.Context) (driver.NodeStatus, error)

const ns = "fastblk"

var (
	// volLabels name a volume: its CSI ID and name (the PV's name under
	// Kubernetes), and the PVC namespace, PVC and PV names the provisioner
	// passed (--extra-create-metadata; empty, so absent in Prometheus,
	// for volumes created without them). The last three are named as
	// kube-state-metrics and the kubelet name them, so queries join on
	// them without relabelling (scrape with honor_labels: the target's own
	// namespace label would otherwise rename this one exported_namespace).
	volLabels = []string{"volume_id", "name", "namespace", "persistentvolumeclaim", "persistentvolume", "device_class"}
	// classLabels name a device class (package devclass; "default" is
	// the data directory's).
	classLabels = []string{"device_class"}
	// pullLabels name a copy in flight: its target and its source.
	pullLabels = []string{"volume_id", "name", "namespace", "persistentvolumeclaim", "source", "source_node"}

	descBuild     = prometheus.NewDesc(ns+"_build_info", "Always 1; the labels are facts fixed for the life of the plugin process: its version, VCS revision, Go version, backend and kernel release.", []string{"version", "revision", "goversion", "backend", "kernel"}, nil)
	descUp        = prometheus.NewDesc(ns+"_healthy", "1 when the plugin's backend and data directory are usable.", nil, nil)
	descFSFree    = prometheus.NewDesc(ns+"_node_filesystem_free_bytes", "Free space of the device class's filesystem, whatever volumes may still grow into.", classLabels, nil)
	descAlloc     = prometheus.NewDesc(ns+"_volume_allocated_bytes", "Disk space the volume's sparse file takes.", volLabels, nil)
	descCapAvail  = prometheus.NewDesc(ns+"_node_capacity_available_bytes", "Bytes the device class can still provision on the node (after its reserve and over-provisioning): what GetCapacity reports for its StorageClasses.", classLabels, nil)
	descCapTotal  = prometheus.NewDesc(ns+"_node_capacity_total_bytes", "Size of the device class's filesystem, times its over-provisioning ratio when it is above 1.", classLabels, nil)
	descVolumes   = prometheus.NewDesc(ns+"_volumes", "Volumes of the device class on this node.", classLabels, nil)
	descSnapshots = prometheus.NewDesc(ns+"_snapshots", "Snapshots of the device class on this node.", classLabels, nil)
	descClassDown = prometheus.NewDesc(ns+"_device_class_unavailable", "1 for a device class the node cannot serve (a bad directory, or removed while volumes use it), labelled with its volumes out of service; absent for the classes it serves.", append(classLabels, "path"), nil)
	descStranded  = prometheus.NewDesc(ns+"_device_class_stranded_volumes", "Volumes in the directory of a device class the node cannot serve: out of service, their files kept, until it can.", classLabels, nil)
	descQuarant   = prometheus.NewDesc(ns+"_quarantined_records", "Records (volume metadata, ublk device states) set aside because they could not be read; each keeps its volume out of service until an operator restores or removes it.", nil, nil)
	descPids      = prometheus.NewDesc(ns+"_node_pids_headroom", "Tasks the plugin's cgroup may still start under its pids limit (absent without a limit): the Go runtime's threads and the mkfs and mount children need room under it.", nil, nil)
	descSize      = prometheus.NewDesc(ns+"_volume_size_bytes", "Provisioned size of the volume.", volLabels, nil)
	descState     = prometheus.NewDesc(ns+"_volume_device_state", "1 for the device's current state.", append(volLabels, "backend", "state"), nil)
	descQueues    = prometheus.NewDesc(ns+"_volume_queues", "Hardware queues of the volume's device.", volLabels, nil)
	descDepth     = prometheus.NewDesc(ns+"_volume_queue_depth", "Depth of each queue of the volume's device.", volLabels, nil)
	descMaxIO     = prometheus.NewDesc(ns+"_volume_max_io_bytes", "Largest request the volume's ublk device takes.", volLabels, nil)
	descIOs       = prometheus.NewDesc(ns+"_volume_ios_total", "I/Os completed by the device.", append(volLabels, "op"), nil)
	descBytes     = prometheus.NewDesc(ns+"_volume_bytes_total", "Bytes transferred (or discarded) by the device.", append(volLabels, "op"), nil)
	descIOTime    = prometheus.NewDesc(ns+"_volume_io_time_seconds_total", "Time I/Os of the op spent in the device (kernel accounting).", append(volLabels, "op"), nil)
	descInFlight  = prometheus.NewDesc(ns+"_volume_in_flight_ios", "I/Os in flight on the device.", volLabels, nil)
	descErrors    = prometheus.NewDesc(ns+"_volume_errors_total", "I/Os the server completed with an error.", volLabels, nil)
	descRecovered = prometheus.NewDesc(ns+"_volume_recoveries_total", "Times the device was re-adopted by this plugin process: after a plugin restart, or after its server thread failed (counts from the process start).", volLabels, nil)
	descLatency   = prometheus.NewDesc(ns+"_volume_io_latency_seconds", "Latency of I/Os served by the plugin's ublk server.", volLabels, nil)
	descLimIOPS   = prometheus.NewDesc(ns+"_volume_limit_iops", "The volume's rate limit in reads plus writes per second (absent without one).", volLabels, nil)
	descLimBytes  = prometheus.NewDesc(ns+"_volume_limit_bytes_per_second", "The volume's rate limit in bytes read plus written per second (absent without one).", volLabels, nil)
	descThrottled = prometheus.NewDesc(ns+"_volume_throttled_ios_total", "I/Os the volume's rate limits held back.", volLabels, nil)
	descThrotTime = prometheus.NewDesc(ns+"_volume_throttled_seconds_total", "Time I/Os waited for the volume's rate limits.", volLabels, nil)
	descPullRecv  = prometheus.NewDesc(ns+"_pull_received_bytes", "Data bytes received so far by a copy in flight from another node (a restore or clone whose source lives there).", pullLabels, nil)
	descPullExp   = prometheus.NewDesc(ns+"_pull_expected_bytes", "The most data bytes a copy in flight from another node will receive (the source's allocated bytes; holes and zeros do not travel).", pullLabels, nil)
	descPullSize  = prometheus.NewDesc(ns+"_pull_source_size_bytes", "Size of the source of a copy in flight from another node.", pullLabels, nil)
	descFailingIO = prometheus.NewDesc(ns+"_ublk_devices_failing_io", "ublk devices the plugin keeps but cannot re-adopt (no readable record names them) whose I/O it fails with EIO instead of holding it, after --ublk-fail-unserved-after.", nil, nil)
	descCopies    = prometheus.NewDesc(ns+"_copy_pacing_copies", "Background copies (restores, clones, streams to and from other nodes) this node paces now.", nil, nil)
	descCopyAllow = prometheus.NewDesc(ns+"_copy_pacing_allowed_bytes_per_second", "What this node's background copies together may move while a volume is in use, set from what they cost it; each copy still moves at least a tenth of its rate (0: each at that floor; absent while they are bounded by their own rates alone).", nil, nil)
	descCopyCost  = prometheus.NewDesc(ns+"_copy_pacing_cost", "Share of its IOPS the background copies cost the worst-hit volume while they ran, in the last pause that measured one.", nil, nil)
	descCopyPause = prometheus.NewDesc(ns+"_copy_pacing_pauses_total", "Pauses of the background copies to measure the volumes in use without them.", nil, nil)
	descFallback  = prometheus.NewDesc(ns+"_backend_fallback", "1 when --backend auto serves with loop devices although the node has ublk, labelled with why (absent otherwise).", []string{"reason"}, nil)
)

// Startup holds what the plugin learned at start-up and reports as is.
type Startup struct {
	// BackendFallback is why --backend auto serves with loop devices on a
	// node whose kernel has ublk (backend.Fallback.Reason); "" when it
	// did not fall back.
	BackendFallback string
}

// Collector is a prometheus.Collector over a StatusFunc.
type Collector struct {
	status  StatusFunc
	startup Startup
}

// NewCollector returns a collector that calls status at every scrape and
// reports startup.
func NewCollector(status StatusFunc, startup Startup) *Collector {
	return &Collector{status: status, startup: startup}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBuild, descUp, descFSFree, descAlloc, descCapAvail, descCapTotal, descVolumes, descSnapshots, descClassDown, descStranded, descQuarant, descPids, descSize,
		descState, descQueues, descDepth, descMaxIO, descIOs, descBytes, descIOTime, descInFlight, descErrors, descRecovered, descLatency,
		descLimIOPS, descLimBytes, descThrottled, descThrotTime, descFallback, descFailingIO, descPullRecv, descPullExp, descPullSize,
		descCopies, descCopyAllow, descCopyCost, descCopyPause} {
		ch <- d
	}
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.status(ctx)
	if err != nil {
		klog.ErrorS(err, "collect metrics")
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge(descBuild, 1, st.Version, revision, runtime.Version(), st.Backend, st.Kernel)
	gauge(descUp, b2f(st.Healthy))
	if r := c.startup.BackendFallback; r != "" {
		gauge(descFallback, 1, r)
	}
	for _, cl := range st.Classes {
		if cl.Unavailable {
			gauge(descClassDown, 1, cl.Name, cl.Path)
			gauge(descStranded, float64(len(cl.Stranded)), cl.Name)
			continue
		}
		gauge(descFSFree, float64(cl.FilesystemFree), cl.Name)
		gauge(descCapAvail, float64(cl.CapacityAvailable), cl.Name)
		gauge(descCapTotal, float64(cl.CapacityTotal), cl.Name)
		gauge(descVolumes, float64(cl.Volumes), cl.Name)
		gauge(descSnapshots, float64(cl.Snapshots), cl.Name)
	}
	gauge(descQuarant, float64(len(st.Quarantined)))
	if st.Backend == "ublk" {
		gauge(descFailingIO, float64(len(st.FailingIO)))
	}
	if st.PidsHeadroom != nil {
		gauge(descPids, float64(*st.PidsHeadroom))
	}
	for _, p := range st.Pulls {
		l := []string{p.VolumeID, p.Name, p.PVCNamespace, p.PVCName, p.Source, p.SourceNode}
		gauge(descPullRecv, float64(p.ReceivedBytes), l...)
		gauge(descPullExp, float64(p.ExpectedBytes), l...)
		gauge(descPullSize, float64(p.SizeBytes), l...)
	}
	cp := st.CopyPacing
	gauge(descCopies, float64(cp.Copies))
	if cp.Bounded {
		gauge(descCopyAllow, cp.AllowedBytesPerSecond)
	}
	gauge(descCopyCost, cp.Cost)
	counter(descCopyPause, float64(cp.Pauses))
	for _, v := range st.Volumes {
		l := []string{v.ID, v.Name, v.PVCNamespace, v.PVCName, v.PVName, v.Class}
		gauge(descSize, float64(v.SizeBytes), l...)
		gauge(descAlloc, float64(v.AllocatedBytes), l...)
		if v.Limits.IOPS > 0 {
			gauge(descLimIOPS, float64(v.Limits.IOPS), l...)
		}
		if v.Limits.BytesPerSecond > 0 {
			gauge(descLimBytes, float64(v.Limits.BytesPerSecond), l...)
		}
		if v.Device == "" {
			continue
		}
		gauge(descState, 1, append(l, v.Backend, deviceState(v))...)
		gauge(descQueues, float64(v.Tuning.Queues), l...)
		gauge(descDepth, float64(v.Tuning.QueueDepth), l...)
		if v.Tuning.MaxIOBytes > 0 {
			gauge(descMaxIO, float64(v.Tuning.MaxIOBytes), l...)
		}
		if d := v.Disk; d != nil {
			collectDisk(counter, gauge, l, d)
		}
		if io := v.IO; io != nil {
			counter(descErrors, float64(io.Errors), l...)
			counter(descRecovered, float64(io.Recoveries), l...)
			counter(descThrottled, float64(io.Throttled), l...)
			counter(descThrotTime, io.ThrottledSeconds, l...)
			if len(io.LatencyBounds) > 0 && len(io.LatencyBounds) == len(io.LatencyCounts) {
				buckets := make(map[float64]uint64, len(io.LatencyBounds))
				for i, b := range io.LatencyBounds {
					buckets[b] = io.LatencyCounts[i]
				}
				ch <- prometheus.MustNewConstHistogram(descLatency, io.LatencyCount, io.LatencySum, buckets, l...)
			}
		}
	}
}

func collectDisk(counter, gauge func(*prometheus.Desc, float64, ...string), l []string, d *blkdev.Stats) {
	const sector = 512
	with := func(op string) []string { return append(append([]string(nil), l...), op) }
	counter(descIOs, float64(d.ReadIOs), with("read")...)
	counter(descIOs, float64(d.WriteIOs), with("write")...)
	counter(descIOs, float64(d.DiscardIOs), with("discard")...)
	counter(descIOs, float64(d.FlushIOs), with("flush")...)
	counter(descBytes, float64(d.ReadSectors*sector), with("read")...)
	counter(descBytes, float64(d.WriteSectors*sector), with("write")...)
	counter(descBytes, float64(d.DiscardSectors*sector), with("discard")...)
	counter(descIOTime, float64(d.ReadTicksMs)/1000, with("read")...)
	counter(descIOTime, float64(d.WriteTicksMs)/1000, with("write")...)
	gauge(descInFlight, float64(d.InFlight), l...)
}

// revision is the VCS revision the binary was built from ("" when the
// build did not record one).
var revision = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}()

func deviceState(v driver.VolumeStatus) string {
	if v.IO != nil && v.IO.State != "" {
		return v.IO.State
	}
	return "live"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
