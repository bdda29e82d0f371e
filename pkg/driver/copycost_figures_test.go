package driver

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
)

// copyDesign is a way of running a background copy, measured against the
// others by TestCopyCostFigures.
type copyDesign struct {
	name string
	// apply sets the design up on both nodes and returns its undo.
	apply func(t *testing.T, n1, n2 *testNode) (undo func())
}

// copyDesigns are the designs TestCopyCostFigures knows, by name.
var copyDesigns = map[string]copyDesign{
	// rate: the copy bounded by its bytes per second only (before
	// copypace).
	"rate": {"rate", func(t *testing.T, n1, n2 *testNode) func() { return pacing(-1, n1, n2) }},
	// paced: copypace's Governor at its default budget.
	"paced": {"paced", func(t *testing.T, n1, n2 *testNode) func() { return pacing(0, n1, n2) }},
	// idle: no Governor; every thread of both plugins in SCHED_IDLE and
	// the idle I/O class while the copy runs (an experiment: on the loop
	// backend the plugins' threads do nothing but the copy then).
	"idle": {"idle", func(t *testing.T, n1, n2 *testNode) func() {
		undo := pacing(-1, n1, n2)
		setThreads(t, schedIdle, ioprioIdle)
		return func() { setThreads(t, schedOther, 0); undo() }
	}},
	// nice: no Governor; every thread of both plugins at nice 19 (an
	// experiment, as idle).
	"nice": {"nice", func(t *testing.T, n1, n2 *testNode) func() {
		undo := pacing(-1, n1, n2)
		setThreads(t, nice19, 0)
		return func() { setThreads(t, schedOther, 0); undo() }
	}},
}

// pacing gives the nodes Governors with the budget, and returns the undo.
func pacing(budget float64, nodes ...*testNode) func() {
	old := make([]*copypace.Governor, len(nodes))
	for i, n := range nodes {
		old[i] = n.d.copies
		n.d.copies = copypace.New(copypace.Config{Devices: n.d.attachedDevices, Budget: budget})
	}
	return func() {
		for i, n := range nodes {
			n.d.copies = old[i]
		}
	}
}

// TestCopyCostFigures measures what a restore and a clone copying in the
// background cost a volume in use on the same node, for each design of
// FASTBLK_COPY_DESIGNS (default "rate paced idle"), interleaved: fio (4k
// random reads, then random writes, queue depth 32, direct, libaio) on n1's
// volume, its IOPS in the 3 s before each copy (idle) and during it. Four
// copies of 1 GiB whose first half is written:
//   - restore, local: n1 restores the snapshot of a raw block volume
//     that fio uses;
//   - restore, pulled: n2 restores it over the peer channel;
//   - clone, local: n1 clones a volume mounted ext4 that fio uses (a file
//     of 512 MiB in it);
//   - clone, pulled: n2 clones it.
//
// n2's data directory is a tmpfs, so that only n1's work reaches the disk,
// as with n2 on another machine; both plugins share the CPUs with fio.
// Before each copy the file it reads is dropped from the page cache.
// Environment: FASTBLK_COPY_FIGURES=1 runs it; FASTBLK_COPY_BACKEND (loop
// or ublk, n1's backend), FASTBLK_COPY_SIZE (bytes, default 1 GiB),
// FASTBLK_COPY_REPS (default 3), FASTBLK_COPY_ONLY (a regexp on
// "<copy>/<fio>/<design>"), FASTBLK_COPY_V (klog's verbosity: 4 logs each
// cycle of the Governor), FASTBLK_COPY_PROFILE (see profileCopy). Figures go to docs/benchmarks.md.
func TestCopyCostFigures(t *testing.T) {
	if os.Getenv("FASTBLK_COPY_FIGURES") == "" {
		t.Skip("FASTBLK_COPY_FIGURES unset")
	}
	requireRoot(t)
	if _, err := exec.LookPath("fio"); err != nil {
		t.Fatal("no fio")
	}
	kind := envOr("FASTBLK_COPY_BACKEND", "loop")
	size, err := strconv.ParseInt(envOr("FASTBLK_COPY_SIZE", strconv.Itoa(1<<30)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := strconv.Atoi(envOr("FASTBLK_COPY_REPS", "3"))
	if err != nil {
		t.Fatal(err)
	}
	var designs []copyDesign
	for _, name := range strings.Fields(envOr("FASTBLK_COPY_DESIGNS", "rate paced idle")) {
		d, ok := copyDesigns[name]
		if !ok {
			t.Fatalf("unknown design %q", name)
		}
		designs = append(designs, d)
	}
	only := regexp.MustCompile(os.Getenv("FASTBLK_COPY_ONLY"))
	if v := os.Getenv("FASTBLK_COPY_V"); v != "" { // the Governor's log: -v=4
		var fs flag.FlagSet
		klog.InitFlags(&fs)
		if err := fs.Set("v", v); err != nil {
			t.Fatal(err)
		}
	}
	half := size / 2

	n1, n2, _ := peerNodesIn(t, kind, testfs.MountTmpfs(t, 2*size+64<<20))
	blk, snap := n1.source(size, [][2]int64{{0, half}})
	dev := n1.stage(blk, blockCap(snw), false)
	fs := n1.create("pvc-fs", size, nil)
	file := filepath.Join(n1.stage(fs, mountCap("ext4", snw), false), "data")
	testfs.Run(t, "fio", "--name=layout", "--filename="+file, "--rw=write", "--bs=1M", "--size="+strconv.FormatInt(half, 10),
		"--ioengine=psync", "--direct=1", "--end_fsync=1")

	type copyCase struct {
		name   string
		n      *testNode // where the copy is made
		src    *csi.VolumeContentSource
		reads  string // the file the copy reads
		fioOn  string // the file fio uses
		source string // which of the two volumes: "restore" or "clone"
	}
	cases := []copyCase{
		{"restore, local", n1, snapshotSource(snap), n1.file(snap), dev, "restore"},
		{"restore, pulled", n2, snapshotSource(snap), n1.file(snap), dev, "restore"},
		{"clone, local", n1, volumeSource(fs), n1.file(fs), file, "clone"},
		{"clone, pulled", n2, volumeSource(fs), n1.file(fs), file, "clone"},
	}
	type key struct{ copy, rw, design string }
	type series struct{ idle, during, ratio, took, cpu, stall []float64 }
	results := map[key]*series{}
	t.Logf("backend %s, %d bytes of which %d written, load average at the start: %s", kind, size, half, loadAvg(t))
	seq := 0
	for rep := range reps {
		for _, source := range []string{"restore", "clone"} {
			for _, rw := range []string{"randread", "randwrite"} {
				var todo []copyCase
				for _, c := range cases {
					if c.source == source && only.MatchString(c.name+"/"+rw+"/") {
						todo = append(todo, c)
					}
				}
				if len(todo) == 0 {
					continue
				}
				fio := startIOPSLog(t, todo[0].fioOn, rw, half)
				time.Sleep(time.Second) // fio ramps up
				type window struct {
					k                  key
					idleFrom, from, to time.Time
					cpu                time.Duration
					pacing             string
				}
				var ws []window
				for _, c := range todo {
					for i := range designs {
						// Each repetition starts with another design.
						d := designs[(i+rep)%len(designs)]
						k := key{c.name, rw, d.name}
						if !only.MatchString(k.copy + "/" + k.rw + "/" + k.design) {
							continue
						}
						testfs.DropCache(t, c.reads)
						w := window{k: k, idleFrom: time.Now()}
						time.Sleep(3 * time.Second)
						undo := d.apply(t, n1, n2)
						seq++
						stop := watchPacing(n1.d.copies)
						endProfile := profileCopy(t, seq)
						cpu0 := cpuTime(t)
						w.from = time.Now()
						v, err := c.n.createPulled(fmt.Sprintf("pvc-copy-%d", seq), size, c.src, nil, 10*time.Minute)
						w.to = time.Now()
						endProfile()
						w.cpu = cpuTime(t) - cpu0
						w.pacing = stop()
						undo()
						if err != nil {
							t.Fatalf("%s, %s: %v", c.name, d.name, err)
						}
						if _, err := c.n.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
							t.Fatal(err)
						}
						ws = append(ws, w)
					}
				}
				samples := fio.stop(t)
				for _, w := range ws {
					before, _ := windowIOPS(samples, w.idleFrom, w.from)
					during, stalled := windowIOPS(samples, w.from, w.to)
					secs := w.to.Sub(w.from).Seconds()
					r := results[w.k]
					if r == nil {
						r = &series{}
						results[w.k] = r
					}
					r.idle, r.during, r.ratio = append(r.idle, before), append(r.during, during), append(r.ratio, during/before)
					r.took, r.cpu, r.stall = append(r.took, secs), append(r.cpu, w.cpu.Seconds()), append(r.stall, stalled.Seconds())
					t.Logf("COPYCOST rep=%d copy=%q fio=%s design=%s idle=%.0f during=%.0f ratio=%.3f stall=%.2f took=%.2f cpu=%.2f %s",
						rep+1, w.k.copy, rw, w.k.design, before, during, during/before, stalled.Seconds(), secs, w.cpu.Seconds(), w.pacing)
				}
			}
		}
	}
	t.Logf("load average at the end: %s", loadAvg(t))
	t.Logf("| copy | fio | design | copy time | plugins' CPU | IOPS idle | IOPS during | during/idle: median (runs) | longest without I/O |")
	t.Logf("|---|---|---|---|---|---|---|---|---|")
	for _, c := range cases {
		for _, rw := range []string{"randread", "randwrite"} {
			for _, d := range designs {
				r := results[key{c.name, rw, d.name}]
				if r == nil {
					continue
				}
				t.Logf("| %s | %s | %s | %.1f s | %.1f s | %.0f | %.0f | **%.2f** (%s) | %.2f s |", c.name, rw, d.name, median(r.took), median(r.cpu),
					median(r.idle), median(r.during), median(r.ratio), runs(r.ratio), median(r.stall))
			}
		}
	}
}

// profileCopy profiles the copy seq, when FASTBLK_COPY_PROFILE names a
// directory: the whole machine with perf (perf-<seq>.data) and this
// process with pprof (cpu-<seq>.pprof). It returns the end of both.
func profileCopy(t *testing.T, seq int) (end func()) {
	dir := os.Getenv("FASTBLK_COPY_PROFILE")
	if dir == "" {
		return func() {}
	}
	perf := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", filepath.Join(dir, fmt.Sprintf("perf-%d.data", seq)))
	if err := perf.Start(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", seq)))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		perf.Process.Signal(os.Interrupt)
		perf.Wait()
	}
}

// watchPacing samples g's status until the returned stop, which sums it
// up: n1's pauses, and the least and last allowance it set.
func watchPacing(g *copypace.Governor) (stop func() string) {
	done, out := make(chan struct{}), make(chan string)
	go func() {
		var last copypace.Status
		least := math.Inf(1)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				st := g.Status()
				if st.Copies > 0 {
					last = st
					if a := st.AllowedBytesPerSecond; a > 0 {
						least = min(least, a)
					}
				}
			case <-done:
				out <- fmt.Sprintf("pauses=%d allow_least=%.0fMiB/s allow_last=%.0fMiB/s cost_last=%.2f", last.Pauses, least/(1<<20),
					last.AllowedBytesPerSecond/(1<<20), last.Cost)
				return
			}
		}
	}()
	return func() string { close(done); return <-out }
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Scheduling settings of setThreads.
const (
	schedOther = iota
	schedIdle
	nice19
)

// setThreads puts every thread of this process (both plugins; not fio) in
// the scheduling class sched and the I/O priority prio (0: none). Threads
// started meanwhile inherit it from the thread that starts them.
func setThreads(t *testing.T, sched, prio int) {
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
		policy, niceness := unix.SCHED_NORMAL, 0
		switch sched {
		case schedIdle:
			policy = unix.SCHED_IDLE
		case nice19:
			niceness = 19
		}
		var param [1]int32 // struct sched_param: sched_priority 0
		if _, _, errno := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(policy), uintptr(unsafe.Pointer(&param))); errno != 0 && errno != unix.ESRCH {
			t.Fatalf("sched_setscheduler %d: %v", tid, errno)
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, niceness); err != nil && err != unix.ESRCH {
			t.Fatalf("setpriority %d: %v", tid, err)
		}
		const whoProcess = 1 // IOPRIO_WHO_PROCESS: a thread
		if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, whoProcess, uintptr(tid), uintptr(prio)); errno != 0 && errno != unix.ESRCH {
			t.Fatalf("ioprio_set %d: %v", tid, errno)
		}
	}
}
