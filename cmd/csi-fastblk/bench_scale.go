package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// scaleConfig is one run of `csi-fastblk bench scale`: fio on many devices
// at once, csi-fastblk volumes driven over CSI or kernel loop devices.
type scaleConfig struct {
	mode       string // "csi", "loop", "file" or "ref"
	endpoint   string // csi: the plugin's CSI endpoint
	pid        int    // csi: the plugin's pid, for its threads, RSS and CPU
	volumes    int
	size       int64
	rw, bs     string
	iodepth    int
	jobs       int // fio jobs per volume
	runtime    int // seconds
	fio        string
	losetup    string
	dir        string // work directory on the data disk
	params     string // csi: StorageClass parameters, k=v,k=v
	mkfsSample int    // csi: volumes staged with ext4 to time stage + mkfs
	// latProbe runs the first device at iodepth 1 on its own and
	// reports its latency percentiles (the others run as configured).
	latProbe bool
	probeRW  string // the probe's fio --rw ("": rw)
	// metrics is the plugin's /metrics URL (mode csi): with latProbe,
	// the probe volume's mean latency inside the server is reported
	// beside fio's, which tells the server's share of it.
	metrics string
	// refUblk is the reference ublk server's command (mode ref), and
	// refQueues and refDepth its devices' geometry.
	refUblk             string
	refQueues, refDepth int
}

// runBenchScale runs fio (4k random at a small depth on every device at
// once, by default) over N csi-fastblk volumes, each created, staged and
// published over CSI as kubelet would, or over N kernel loop devices with
// direct I/O on files of the same size, and prints one SCALE line of
// key=value figures for hack/vm/bench-scale.sh to tabulate.
func runBenchScale(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench scale", flag.ContinueOnError)
	c, size := scaleFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if c.size, err = parseBenchSize(*size); err != nil {
		return fmt.Errorf("bench scale: --size: %w", err)
	}
	if c.volumes < 1 || c.jobs < 1 || c.iodepth < 1 {
		return fmt.Errorf("bench scale: --volumes, --jobs and --iodepth must be positive")
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	switch c.mode {
	case "csi":
		return scaleCSI(ctx, *c)
	case "loop", "file":
		return scaleLoop(ctx, *c)
	case "ref":
		return scaleRef(ctx, *c)
	}
	return fmt.Errorf("bench scale: --mode %q: want csi, loop, file or ref", c.mode)
}

// scaleFlags declares the flags of `csi-fastblk bench scale`; size is
// --size as given.
func scaleFlags(fs *flag.FlagSet) (c *scaleConfig, size *string) {
	c, size = &scaleConfig{}, new(string)
	fs.StringVar(&c.mode, "mode", "csi", "csi (volumes through the plugin), loop (kernel loop devices with direct I/O), file (fio on the files themselves, direct I/O: the data disk's own figures) or ref (a reference ublk server's loop target, see --ref-ublk)")
	fs.StringVar(&c.endpoint, "endpoint", "unix:///tmp/csi-fastblk.sock", "the plugin's CSI endpoint (mode csi)")
	fs.IntVar(&c.pid, "pid", 0, "the plugin's pid, for its threads, RSS and CPU (mode csi)")
	fs.IntVar(&c.volumes, "volumes", 16, "volumes (devices) busy at once")
	fs.StringVar(size, "size", "64Mi", "size of each volume")
	fs.StringVar(&c.rw, "rw", "randread", "fio --rw")
	fs.StringVar(&c.bs, "bs", "4k", "fio --bs")
	fs.IntVar(&c.iodepth, "iodepth", 4, "fio --iodepth of each job")
	fs.IntVar(&c.jobs, "jobs", 1, "fio jobs per volume")
	fs.IntVar(&c.runtime, "runtime", 10, "seconds of each fio run (plus 2 s ramp)")
	fs.StringVar(&c.fio, "fio", "/usr/bin/fio", "fio binary")
	fs.StringVar(&c.losetup, "losetup", "/usr/sbin/losetup", "losetup binary (mode loop)")
	fs.StringVar(&c.dir, "dir", "/data/scale", "work directory (backing files, staging and target paths)")
	fs.StringVar(&c.params, "params", "", "StorageClass parameters of the volumes, k=v,k=v (mode csi)")
	fs.IntVar(&c.mkfsSample, "mkfs-sample", 4, "volumes also staged with ext4, to time stage with its first mkfs (mode csi)")
	fs.BoolVar(&c.latProbe, "lat-probe", false, "run the first device at iodepth 1 and print a LAT line of its latency percentiles (the others run as --iodepth says)")
	fs.StringVar(&c.metrics, "metrics", "", "with --lat-probe in mode csi: the plugin's /metrics URL, to report the probe's mean latency inside the server (server_mean_us)")
	fs.StringVar(&c.probeRW, "probe-rw", "", "with --lat-probe: the probe's fio --rw (default --rw), e.g. randread beside randwrite neighbours")
	fs.StringVar(&c.refUblk, "ref-ublk", "", "mode ref: the reference ublk server's command (ublksrv's ublk, with its ublk.loop beside it), run as 'add -t loop' per device")
	fs.IntVar(&c.refQueues, "ref-queues", ublk.DefaultQueues(runtime.NumCPU()), "mode ref: queues per device (default: as the plugin chooses on this machine)")
	fs.IntVar(&c.refDepth, "ref-depth", ublk.DefaultDepth, "mode ref: depth of each queue")
	return c, size
}

// scaleCSI measures csi-fastblk volumes through the plugin.
func scaleCSI(ctx context.Context, c scaleConfig) error {
	conn, err := grpc.NewClient(c.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	params := map[string]string{}
	for kv := range strings.SplitSeq(c.params, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			params[k] = v
		}
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	ext4 := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: block.AccessMode}
	type vol struct{ id, staging, target string }
	var vols []vol
	cleanup := func() {
		for _, v := range vols {
			node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
			node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
		}
		vols = nil
	}
	defer cleanup()
	// create, stage and publish one volume; stage time is returned.
	provision := func(name string, cap *csi.VolumeCapability) (vol, time.Duration, error) {
		r, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params,
			CapacityRange: &csi.CapacityRange{RequiredBytes: c.size}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
		if err != nil {
			return vol{}, 0, fmt.Errorf("create %s: %w", name, err)
		}
		v := vol{id: r.Volume.VolumeId, staging: filepath.Join(c.dir, name+".staging"), target: filepath.Join(c.dir, name+".target")}
		vols = append(vols, v)
		if err := os.MkdirAll(v.staging, 0o755); err != nil {
			return v, 0, err
		}
		start := time.Now()
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
			VolumeCapability: cap, VolumeContext: r.Volume.VolumeContext}); err != nil {
			return v, 0, fmt.Errorf("stage %s: %w", name, err)
		}
		took := time.Since(start)
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
			TargetPath: v.target, VolumeCapability: cap, VolumeContext: r.Volume.VolumeContext}); err != nil {
			return v, took, fmt.Errorf("publish %s: %w", name, err)
		}
		return v, took, nil
	}
	var attach []time.Duration
	var devs []string
	for i := range c.volumes {
		v, took, err := provision(fmt.Sprintf("scale-%d", i), block)
		if err != nil {
			return err
		}
		attach = append(attach, took)
		devs = append(devs, v.target)
	}
	if err := c.fill(ctx, devs); err != nil {
		return err
	}
	before, err := procSample(c.pid)
	if err != nil {
		return err
	}
	// The server's figure is a diagnosis: without it the run still counts.
	var probe serverLatency
	var probeErr error
	if c.latProbe && c.metrics != "" {
		probe.sum0, probe.n0, probeErr = c.serverLatency(ctx, "scale-0")
	}
	guest0, err := guestBusyTicks()
	if err != nil {
		return err
	}
	ios, err := c.runFio(ctx, devs)
	if err != nil {
		return err
	}
	after, err := procSample(c.pid)
	if err != nil {
		return err
	}
	guest1, err := guestBusyTicks()
	if err != nil {
		return err
	}
	line := c.describe(ios) + guestCPU(guest1-guest0, ios.total)
	if c.latProbe && c.metrics != "" && probeErr == nil {
		sum, n, err := c.serverLatency(ctx, "scale-0")
		probeErr = err
		if err == nil && n > probe.n0 {
			// Includes the ramp, which fio leaves out.
			line += fmt.Sprintf(" server_mean_us=%.1f", (sum-probe.sum0)*1e6/(n-probe.n0))
		}
	}
	line += fmt.Sprintf(" attach_ms_median=%.1f attach_ms_max=%.1f threads=%d rss_mib=%.1f", ms(median(attach)), ms(slices.Max(attach)),
		after.threads, float64(after.rssKiB)/1024)
	if ios.total > 0 {
		line += fmt.Sprintf(" cpu_us_per_io=%.2f", float64(after.cpuTicks-before.cpuTicks)*1e6/clockTicks/float64(ios.total))
		// Context switches are summed over the threads alive at each
		// sample: a thread that ended in between takes its count along,
		// so a drop says nothing and is left out.
		if d := after.ctxsw - before.ctxsw; d >= 0 {
			line += fmt.Sprintf(" ctxsw_per_io=%.3f", float64(d)/float64(ios.total))
		}
	}
	// Stage time with the first mkfs, on a few more volumes.
	var staged []time.Duration
	for i := range c.mkfsSample {
		_, took, err := provision(fmt.Sprintf("scale-fs-%d", i), ext4)
		if err != nil {
			return err
		}
		staged = append(staged, took)
	}
	if len(staged) > 0 {
		line += fmt.Sprintf(" stage_mkfs_ms_median=%.1f stage_mkfs_ms_max=%.1f", ms(median(staged)), ms(slices.Max(staged)))
	}
	if probeErr != nil {
		fmt.Fprintf(os.Stderr, "bench scale: server latency: %v\n", probeErr)
	}
	fmt.Println(line)
	return nil
}

// serverLatency is the probe volume's latency histogram sum (seconds) and
// count before the run.
type serverLatency struct{ sum0, n0 float64 }

// serverLatency reads the io latency sum and count of the volume created
// as name from the plugin's metrics: the time from the server's receipt of
// each request to its commit. The name, not the CSI volume ID: the metrics
// label the plugin's own volume ID, which the CSI one only begins with.
func (c scaleConfig) serverLatency(ctx context.Context, name string) (sum, n float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.metrics, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	label := `name="` + name + `"`
	found := 0
	for line := range strings.SplitSeq(string(body), "\n") {
		name, rest, _ := strings.Cut(line, "{")
		if !strings.Contains(rest, label) {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		switch name {
		case "fastblk_volume_io_latency_seconds_sum":
			sum = v
			found++
		case "fastblk_volume_io_latency_seconds_count":
			n = v
			found++
		}
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("metrics: no io latency of volume %s", name)
	}
	return sum, n, nil
}

// scaleLoop measures kernel loop devices with direct I/O on files of the
// same size, or (mode file) the files themselves.
func scaleLoop(ctx context.Context, c scaleConfig) error {
	var devs []string
	defer func() {
		for _, d := range devs {
			if c.mode == "loop" {
				exec.Command(c.losetup, "-d", d).Run()
			}
		}
	}()
	for i := range c.volumes {
		file, err := c.backingFile(fmt.Sprintf("loop-%d.img", i))
		if err != nil {
			return err
		}
		defer os.Remove(file)
		if c.mode == "file" {
			devs = append(devs, file)
			continue
		}
		out, err := exec.CommandContext(ctx, c.losetup, "--direct-io=on", "--find", "--show", file).Output()
		if err != nil {
			return fmt.Errorf("losetup %s: %w", file, err)
		}
		dev := strings.TrimSpace(string(out))
		devs = append(devs, dev)
		// A loop device without direct I/O reads from the page cache:
		// a baseline that flatters loop (busybox's losetup ignores
		// --direct-io; the kernel may refuse it for the file).
		dio, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/dio"))
		if err != nil || strings.TrimSpace(string(dio)) != "1" {
			return fmt.Errorf("%s on %s: direct I/O is not on (loop/dio %q, %v)", dev, file, strings.TrimSpace(string(dio)), err)
		}
	}
	if err := c.fill(ctx, devs); err != nil {
		return err
	}
	ios, guest, err := c.runFioGuestCPU(ctx, devs)
	if err != nil {
		return err
	}
	fmt.Println(c.describe(ios) + guest)
	return nil
}

// runFioGuestCPU is runFio with the machine's busy CPU per I/O of the run
// (guestCPU's field).
func (c scaleConfig) runFioGuestCPU(ctx context.Context, devs []string) (fioResult, string, error) {
	guest0, err := guestBusyTicks()
	if err != nil {
		return fioResult{}, "", err
	}
	ios, err := c.runFio(ctx, devs)
	if err != nil {
		return ios, "", err
	}
	guest1, err := guestBusyTicks()
	if err != nil {
		return ios, "", err
	}
	return ios, guestCPU(guest1-guest0, ios.total), nil
}

// backingFile makes the sparse file name of the run's size in its work
// directory and returns its path.
func (c scaleConfig) backingFile(name string) (string, error) {
	file := filepath.Join(c.dir, name)
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		return "", err
	}
	return file, os.Truncate(file, c.size)
}

// describe prints the run's figures: a SCALE line, or with latProbe a LAT
// line of the probe's latency (busy: how many other devices ran).
func (c scaleConfig) describe(r fioResult) string {
	if c.latProbe {
		rw := c.rw
		if c.probeRW != "" && c.probeRW != c.rw {
			rw = c.probeRW + "/" + c.rw // the probe's, then the others'
		}
		return fmt.Sprintf("LAT mode=%s volumes=%d rw=%s bs=%s busy=%d probe_iops=%.0f mean_us=%.1f p50_us=%.1f p99_us=%.1f p999_us=%.1f iops=%.0f",
			c.mode, c.volumes, rw, c.bs, c.volumes-1, r.probeIOPS, r.latMean, r.lat[0], r.lat[1], r.lat[2], r.iops)
	}
	return fmt.Sprintf("SCALE mode=%s volumes=%d rw=%s bs=%s iodepth=%d jobs=%d iops=%.0f", c.mode, c.volumes, c.rw, c.bs, c.iodepth, c.jobs, r.iops)
}
