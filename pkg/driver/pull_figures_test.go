package driver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// countingPeers is n2's peer client, counting the data bytes of streams.
type countingPeers struct {
	Forwarder
	bytes int64
}

func (c *countingPeers) ReadData(ctx context.Context, tag string, req *peer.ReadRequest, sink peer.Sink, idle time.Duration) (peer.Received, error) {
	got, err := c.Forwarder.ReadData(ctx, tag, req, sink, idle)
	c.bytes += got.Bytes
	return got, err
}

// TestPullFigures measures a restore of a 1 GiB volume half written (8 MiB
// of data every 16 MiB) on the snapshot's node and on another node joined
// by the peer channel on 127.0.0.1, unbounded and at the default rate. Run
// with FASTBLK_PULL_FIGURES=1; figures go to docs/benchmarks.md.
func TestPullFigures(t *testing.T) {
	if os.Getenv("FASTBLK_PULL_FIGURES") == "" {
		t.Skip("FASTBLK_PULL_FIGURES unset")
	}
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	counter := &countingPeers{Forwarder: n2.d.cfg.Peers}
	n2.d.cfg.Peers = counter
	var extents [][2]int64
	for off := int64(0); off < 1<<30; off += 16 << 20 {
		extents = append(extents, [2]int64{off, 8 << 20})
	}
	_, snap := n1.source(1<<30, extents)
	want := fileSum(t, n1.file(snap))
	t.Logf("source: %d bytes allocated of 1 GiB", testfs.Allocated(t, n1.file(snap)))
	for _, tc := range []struct {
		name string
		n    *testNode
		rate string
	}{
		{"same node", n1, ""}, {"other node, unbounded", n2, "0"}, {"other node, default rate", n2, ""},
	} {
		name := "pvc-" + map[bool]string{true: "local", false: "pull"}[tc.n == n1] + tc.rate
		params := map[string]string{}
		if tc.rate != "" {
			params[ParamTransferRate] = tc.rate
		}
		counter.bytes = 0
		cpu0 := cpuTime(t)
		start := time.Now()
		v, err := tc.n.createPulled(name, 1<<30, snapshotSource(snap), params, 5*time.Minute)
		took, cpu := time.Since(start), cpuTime(t)-cpu0
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if fileSum(t, tc.n.file(v.GetVolumeId())) != want {
			t.Fatalf("%s: the data differs", tc.name)
		}
		t.Logf("%s: %v (plugins' CPU %v), %d data bytes over the channel, target allocates %d bytes", tc.name, took.Round(time.Millisecond),
			cpu.Round(time.Millisecond), counter.bytes, testfs.Allocated(t, tc.n.file(v.GetVolumeId())))
		if _, err := tc.n.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPullSourceIOPS measures what a copy to another node costs the volume
// it copies while that volume keeps serving: fio (4k random reads, then
// random writes, queue depth 32, direct, libaio) on n1's volume as its
// pod sees it, idle and while n2 pulls 1 GiB half written (the first 512
// MiB), three times. Two sources:
//   - a restore of the volume's snapshot, the volume a raw block device
//     (fio on its published device);
//   - a clone of the volume itself, mounted ext4 (fio on a 512 MiB file in
//     it): the loop backend cannot hold a raw block device's I/O, and this
//     disk cannot reflink, so a raw block volume in use cannot be cloned
//     here.
//
// Each copy runs at the default rate, unbounded, at 50Mi/s, and at the
// default rate with the plugin's threads in the idle I/O priority class
// (an experiment: the plugin sets no priority). The source's files are
// dropped from the page cache before each copy, as for data not read
// lately, but for one more restore at the default rate whose snapshot is
// left in the page cache (no disk reads: what remains is the CPU the copy
// takes). n2's data directory is a tmpfs, so that only the sender's work
// reaches the disk, as with n2 on another machine; both plugins share the
// CPUs with fio. Run with FASTBLK_PULL_FIGURES=1; figures go to
// docs/benchmarks.md.
func TestPullSourceIOPS(t *testing.T) {
	if os.Getenv("FASTBLK_PULL_FIGURES") == "" {
		t.Skip("FASTBLK_PULL_FIGURES unset")
	}
	requireRoot(t)
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("no fio")
	}
	n1, n2, _ := peerNodesIn(t, "loop", testfs.MountTmpfs(t, 2<<30))
	const size, half = 1 << 30, 512 << 20

	blk, snap := n1.source(size, [][2]int64{{0, half}})
	dev := n1.stage(blk, blockCap(snw), false)

	fs := n1.create("pvc-fs", size, nil)
	file := filepath.Join(n1.stage(fs, mountCap("ext4", snw), false), "data")
	testfs.Run(t, "fio", "--name=layout", "--filename="+file, "--rw=write", "--bs=1M", "--size="+strconv.Itoa(half),
		"--ioengine=psync", "--direct=1", "--end_fsync=1")

	sources := []struct {
		name, file, data string // the source, fio's file, the file the copy reads
		src              *csi.VolumeContentSource
	}{
		{"restore of a snapshot (block)", dev, n1.file(snap), snapshotSource(snap)},
		{"clone of the volume (ext4)", file, n1.file(fs), volumeSource(fs)},
	}
	type copyMode struct {
		name, rate       string
		idlePrio, cached bool
	}
	modes := []copyMode{
		{"200Mi/s (default)", "", false, false}, {"unbounded", "0", false, false}, {"50Mi/s", "50Mi", false, false},
		{"200Mi/s, plugin at idle I/O priority", "", true, false}, {"200Mi/s, snapshot in the page cache", "", false, true},
	}
	// FASTBLK_PULL_ONLY, a regexp on "<source>/<copy>", runs a part.
	only := regexp.MustCompile(os.Getenv("FASTBLK_PULL_ONLY"))
	want := func(src, mode string) bool { return only.MatchString(src + "/" + mode) }
	type key struct{ src, rw, mode string }
	// Each measure's value per repetition.
	type series struct{ idle, during, ratio, took, cpu, stall []float64 }
	results := map[key]*series{}
	t.Logf("load average at the start: %s", loadAvg(t))
	for rep := range 3 {
		for _, s := range sources {
			if !slices.ContainsFunc(modes, func(m copyMode) bool { return want(s.name, m.name) }) {
				continue
			}
			for _, rw := range []string{"randread", "randwrite"} {
				f := startIOPSLog(t, s.file, rw, half)
				time.Sleep(time.Second) // fio ramps up
				type window struct {
					idleFrom, from, to time.Time
					cpu                time.Duration
				}
				ws := map[string]window{}
				for i, m := range modes {
					if m.cached && s.src.GetSnapshot() == nil || !want(s.name, m.name) {
						continue
					}
					if !m.cached {
						testfs.DropCache(t, s.data)
					}
					w := window{idleFrom: time.Now()}
					time.Sleep(3 * time.Second)
					params := map[string]string{}
					if m.rate != "" {
						params[ParamTransferRate] = m.rate
					}
					if m.idlePrio {
						setIOPrio(t, ioprioIdle)
					}
					cpu0 := cpuTime(t)
					w.from = time.Now()
					v, err := n2.createPulled(fmt.Sprintf("pvc-copy-%d", i), size, s.src, params, 5*time.Minute)
					w.to = time.Now()
					w.cpu = cpuTime(t) - cpu0
					if m.idlePrio {
						setIOPrio(t, 0)
					}
					if err != nil {
						t.Fatalf("%s at %s: %v", s.name, m.name, err)
					}
					if _, err := n2.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
						t.Fatal(err)
					}
					ws[m.name] = w
				}
				samples := f.stop(t)
				for _, m := range modes {
					w, ok := ws[m.name]
					if !ok {
						continue
					}
					k := key{s.name, rw, m.name}
					before, _ := windowIOPS(samples, w.idleFrom, w.from)
					during, stalled := windowIOPS(samples, w.from, w.to)
					secs := w.to.Sub(w.from).Seconds()
					r := results[k]
					if r == nil {
						r = &series{}
						results[k] = r
					}
					r.idle, r.during, r.ratio = append(r.idle, before), append(r.during, during), append(r.ratio, during/before)
					r.took, r.cpu, r.stall = append(r.took, secs), append(r.cpu, w.cpu.Seconds()), append(r.stall, stalled.Seconds())
					t.Logf("run %d, %s, %s, copy at %s: %.0f IOPS idle, %.0f during the copy (x%.2f, at most %v without I/O), copy %.2f s, plugins' CPU %.2f s",
						rep+1, s.name, rw, m.name, before, during, during/before, stalled.Round(time.Millisecond), secs, w.cpu.Seconds())
				}
			}
		}
	}
	t.Logf("load average at the end: %s", loadAvg(t))
	t.Logf("| source | fio | copy | copy time | plugins' CPU | IOPS idle | IOPS during the copy | during/idle (runs) | longest without I/O |")
	for _, s := range sources {
		for _, rw := range []string{"randread", "randwrite"} {
			for _, m := range modes {
				r := results[key{s.name, rw, m.name}]
				if r == nil {
					continue
				}
				t.Logf("| %s | %s | %s | %.1f s | %.1f s | %.0f | %.0f | x%.2f (%s) | %.2f s (%s) |", s.name, rw, m.name, median(r.took), median(r.cpu),
					median(r.idle), median(r.during), median(r.ratio), runs(r.ratio), median(r.stall), runs(r.stall))
			}
		}
	}
}

// ioprioIdle is IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)
// (include/uapi/linux/ioprio.h).
const ioprioIdle = 3 << 13

// setIOPrio sets the I/O priority of every thread of this process (the
// plugins' included) to prio (0: none, the default); threads started
// meanwhile inherit it from the thread that starts them.
func setIOPrio(t *testing.T, prio int) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			t.Fatal(err)
		}
		const whoProcess = 1 // IOPRIO_WHO_PROCESS: a thread
		if _, _, errno := syscall.Syscall(syscall.SYS_IOPRIO_SET, whoProcess, uintptr(tid), uintptr(prio)); errno != 0 && errno != syscall.ESRCH {
			t.Fatalf("ioprio_set %d: %v", tid, errno)
		}
	}
}

// cpuTime is the CPU time this process (both plugins, not fio) used so far.
func cpuTime(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the host's load average over 1, 5 and 15 minutes.
func loadAvg(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// iopsLog is fio running a 4k random workload, logging its IOPS every
// 100 ms with wall-clock times.
type iopsLog struct {
	cmd    *exec.Cmd
	prefix string
	out    bytes.Buffer
}

// startIOPSLog starts fio's rw (randread, randwrite) at queue depth 32 on
// the first size bytes of file until stop. libaio, not io_uring: in two
// runs with io_uring, the device of the filesystem fio had used last was
// still busy when the test unstaged it right after fio ended.
func startIOPSLog(t *testing.T, file, rw string, size int64) *iopsLog {
	t.Helper()
	l := &iopsLog{prefix: filepath.Join(t.TempDir(), "fio")}
	l.cmd = exec.Command("fio", "--name=src", "--filename="+file, "--rw="+rw, "--bs=4k", "--iodepth=32",
		"--ioengine=libaio", "--direct=1", "--size="+strconv.FormatInt(size, 10), "--time_based", "--runtime=600",
		"--norandommap", "--randrepeat=0", "--write_iops_log="+l.prefix, "--log_avg_msec=100", "--log_unix_epoch=1")
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l.cmd.ProcessState == nil {
			l.cmd.Process.Kill()
			l.cmd.Wait()
		}
	})
	return l
}

// iopsSample is fio's IOPS from the sample before (100 ms, or longer when
// no I/O completed) up to at.
type iopsSample struct {
	at   time.Time
	iops float64
}

// stop ends fio (on SIGINT it writes its log and exits with 128) and
// returns its samples.
func (l *iopsLog) stop(t *testing.T) []iopsSample {
	t.Helper()
	l.cmd.Process.Signal(os.Interrupt)
	if err := l.cmd.Wait(); err != nil && l.cmd.ProcessState.ExitCode() != 128 {
		t.Fatalf("fio: %v\n%s", err, l.out.String())
	}
	b, err := os.ReadFile(l.prefix + "_iops.1.log")
	if err != nil {
		t.Fatalf("fio's log: %v\n%s", err, l.out.String())
	}
	var out []iopsSample
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ms int64
		var v float64
		if _, err := fmt.Sscanf(line, "%d, %g,", &ms, &v); err != nil {
			t.Fatalf("fio's log: %q: %v", line, err)
		}
		out = append(out, iopsSample{time.UnixMilli(ms), v})
	}
	return out
}

// windowIOPS is fio's IOPS over [from, to] and the longest time without
// a completed I/O that overlaps it. fio logs a sample only when I/O
// completes, with the IOPS since the one before: each sample stands for
// the time since the one before, a stall included.
func windowIOPS(samples []iopsSample, from, to time.Time) (iops float64, longest time.Duration) {
	var ios float64
	var span time.Duration
	for i := 1; i < len(samples); i++ {
		start, end := samples[i-1].at, samples[i].at
		lo, hi := start, end
		if lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		overlap := hi.Sub(lo)
		if overlap <= 0 {
			continue
		}
		ios += samples[i].iops * overlap.Seconds()
		span += overlap
		longest = max(longest, end.Sub(start))
	}
	if span == 0 {
		return 0, 0
	}
	return ios / span.Seconds(), longest
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// runs lists v as "a, b, c".
func runs(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, ", ")
}
