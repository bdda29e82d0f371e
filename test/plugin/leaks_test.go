package plugin

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

const (
	// leakCycles is how many lifecycles TestLifecycleLeaks runs unless
	// FASTBLK_LEAK_CYCLES says otherwise.
	leakCycles = 1000
	// leakWarmup lifecycles run before the first count, so that pools,
	// caches and lazily started goroutines of the plugin exist in both.
	leakWarmup = 5
	// fsEvery makes every fsEvery-th lifecycle an ext4 mount volume;
	// the others are raw block volumes (no mkfs, fast).
	fsEvery = 25
	// ioBytes are written and read back through each published volume.
	ioBytes = 16 << 10
	// mmapsPerThread is how many mappings a new OS thread of a cgo
	// binary brings: its pthread stack and guard page, and the two
	// parts (used and reserved) of the glibc malloc arena it may get.
	mmapsPerThread = 4
)

// rssSecondHalf bounds the RSS growth over the second half of the
// lifecycles: 42 KiB a lifecycle over the VM's 200, as the total's 8 MiB
// bounded before.
const rssSecondHalf = 4 << 20

// leakCount is one resource counted before and after the lifecycles, and
// how much growth is tolerated.
type leakCount struct {
	name  string
	slack int64
}

// leakCounts lists what TestLifecycleLeaks counts, in table order.
// Resources the plugin creates per volume (mounts, devices, files) must
// come back exactly. The fds and goroutines of the plugin may differ by the
// metrics scrape's own keep-alive connection (one fd, one or two serving
// goroutines), which the HTTP server closes on its idle timeout or not.
// Threads and RSS belong to the Go runtime, which keeps what it grew; the
// mappings follow the threads (see mmapsPerThread) plus what the Go heap
// may add. RSS grows once as the heap reaches its collector's goal (4.5-8.8
// MiB in 16 runs of the VM's 200 lifecycles; the larger since the binary
// carries client-go), so its slack is that of a step, and a leak, which
// grows with every lifecycle, is caught by rssSecondHalf.
var leakCounts = []leakCount{
	{"fds", 2},
	{"goroutines", 2},
	{"threads", 4},
	{"mmaps", 2}, // plus mmapsPerThread for each new thread
	{"rss", 12 << 20},
	{"mounts", 0},
	{"devices", 0},
	{"data entries", 0},
	{"device links", 0},
	{"pod entries", 0},
}

// TestLifecycleLeaks runs full lifecycles (create, stage, publish, write
// and read back, unpublish, unstage, delete) against the plugin binary on
// the loop backend (ublk in the VM step 44-plugin-ublk), then every
// failing step once followed by its retry or cleanup, and proves that the
// plugin process and the node end where they started: no growth in fds,
// goroutines, mappings, mounts, devices or files, threads within +4, RSS
// within +12 MiB and within +4 MiB over the second half.
func TestLifecycleLeaks(t *testing.T) {
	testgate.RequireRoot(t)
	cycles := leakCycles
	if s := os.Getenv("FASTBLK_LEAK_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FASTBLK_LEAK_CYCLES=%q: want a positive number", s)
		}
		cycles = n
	}
	p := startPlugin(t)
	t.Cleanup(func() {
		if t.Failed() {
			p.undoLeftovers(t)
		}
	})
	for k := range leakWarmup {
		p.lifecycle(t, k)
	}
	before, mapsBefore := p.counts(t), p.maps(t)
	start := time.Now()
	var mid map[string]int64
	for k := leakWarmup; k < leakWarmup+cycles; k++ {
		if k == leakWarmup+cycles/2 {
			mid = p.counts(t)
		}
		p.lifecycle(t, k)
		if done := k - leakWarmup + 1; done%50 == 0 && done < cycles {
			t.Logf("%d lifecycles in %v", done, time.Since(start).Round(time.Millisecond))
		}
	}
	elapsed := time.Since(start)
	p.failingSteps(t)
	after, mapsAfter := p.counts(t), p.maps(t)

	t.Logf("%d lifecycles (%d ext4) in %v, %v each; then every failing step once",
		cycles, fsCycles(leakWarmup, leakWarmup+cycles), elapsed.Round(time.Millisecond),
		(elapsed / time.Duration(cycles)).Round(time.Microsecond))
	t.Logf("%-13s %12s %12s %8s %8s", "resource", "before", "after", "growth", "allowed")
	newThreads := max(after["threads"]-before["threads"], 0)
	allowed := func(c leakCount) int64 {
		if c.name == "mmaps" {
			return c.slack + mmapsPerThread*newThreads
		}
		return c.slack
	}
	for _, c := range leakCounts {
		b, a := before[c.name], after[c.name]
		t.Logf("%-13s %12d %12d %+8d %8d", c.name, b, a, a-b, allowed(c))
	}
	for _, c := range leakCounts {
		if grew := after[c.name] - before[c.name]; grew > allowed(c) {
			t.Errorf("%s grew by %d (%d → %d), more than the %d allowed", c.name, grew,
				before[c.name], after[c.name], allowed(c))
		}
	}
	t.Logf("rss at the half: %d; over the second half %+d, %d allowed", mid["rss"], after["rss"]-mid["rss"], rssSecondHalf)
	if grew := after["rss"] - mid["rss"]; grew > rssSecondHalf {
		t.Errorf("rss grew by %d over the second half of the lifecycles (%d → %d), more than the %d allowed: it grows with them",
			grew, mid["rss"], after["rss"], rssSecondHalf)
	}
	if t.Failed() {
		t.Logf("mappings of the plugin only before:\n%s\nonly after:\n%s",
			linesNotIn(mapsBefore, mapsAfter), linesNotIn(mapsAfter, mapsBefore))
	}
}

// maps returns the plugin's /proc/<pid>/maps.
func (p *runningPlugin) maps(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// linesNotIn returns the lines of a that b lacks.
func linesNotIn(a, b string) string {
	in := map[string]bool{}
	for line := range strings.Lines(b) {
		in[line] = true
	}
	var out strings.Builder
	for line := range strings.Lines(a) {
		if !in[line] {
			out.WriteString(line)
		}
	}
	return out.String()
}

// undoLeftovers unmounts what is mounted below the test's directory and
// detaches the loop devices of its data directory, so that a failed run
// leaves the host as it found it.
func (p *runningPlugin) undoLeftovers(t *testing.T) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- { // the last mounted is on top
		if f := strings.Fields(lines[i]); len(f) > 4 && strings.HasPrefix(f[4], p.dir+"/") {
			if err := unix.Unmount(f[4], 0); err != nil {
				t.Logf("clean up: unmount %s: %v", f[4], err)
			}
		}
	}
	if testBackend() != "loop" {
		return // ublk devices go with the VM
	}
	for _, dev := range p.loopDeviceList(t) {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Logf("clean up: losetup -d %s: %v %s", dev, err, out)
		}
	}
}

// fsCycles counts the ext4 lifecycles among [from, to).
func fsCycles(from, to int) int {
	n := 0
	for k := from; k < to; k++ {
		if k%fsEvery == 0 {
			n++
		}
	}
	return n
}

var (
	capBlock = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	capExt4 = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
)

// lifecycle runs lifecycle number k: a raw block volume, or an ext4 one
// when k is a multiple of fsEvery.
func (p *runningPlugin) lifecycle(t *testing.T, k int) {
	t.Helper()
	name := fmt.Sprintf("leak-%d", k)
	if k%fsEvery == 0 {
		id, staging, target := p.provision(t, name, 32<<20, capExt4, "mnt")
		checkFileIO(t, target, k)
		p.release(t, id, staging, target)
		return
	}
	id, staging, target := p.provision(t, name, 16<<20, capBlock, "dev")
	checkBlockIO(t, target, k)
	p.release(t, id, staging, target)
}

// pattern is ioBytes that differ from cycle to cycle, so that a read-back
// cannot pass on a previous volume's data.
func pattern(k int) []byte {
	b := make([]byte, ioBytes)
	for i := range b {
		b[i] = byte(k*7 + i/512 + 1)
	}
	return b
}

// checkBlockIO writes pattern(k) at 1 MiB of the published device with
// direct I/O, reads it back, and reads zeros from the untouched first
// ioBytes (a new volume must not show an earlier one's data).
func checkBlockIO(t *testing.T, dev string, k int) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// O_DIRECT wants aligned memory: mmap gives a page-aligned buffer.
	buf, err := syscall.Mmap(-1, 0, ioBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(buf)
	want := pattern(k)
	copy(buf, want)
	if _, err := f.WriteAt(buf, 1<<20); err != nil {
		t.Fatalf("cycle %d: write %s: %v", k, dev, err)
	}
	clear(buf)
	if _, err := f.ReadAt(buf, 1<<20); err != nil {
		t.Fatalf("cycle %d: read %s: %v", k, dev, err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatalf("cycle %d: %s reads back other bytes than were written", k, dev)
	}
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("cycle %d: read %s: %v", k, dev, err)
	}
	if !bytes.Equal(buf, make([]byte, ioBytes)) {
		t.Fatalf("cycle %d: new volume %s has data where nothing was written", k, dev)
	}
}

// checkFileIO writes pattern(k) to a file in the published directory,
// syncs it, and reads it back.
func checkFileIO(t *testing.T, dir string, k int) {
	t.Helper()
	path := filepath.Join(dir, "data")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("cycle %d: %v", k, err)
	}
	want := pattern(k)
	if _, err = f.Write(want); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("cycle %d: write %s: %v", k, path, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cycle %d: %v", k, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("cycle %d: %s reads back other bytes than were written", k, path)
	}
}

// failingSteps makes each step of the lifecycle fail once, for a cause the
// caller can fix, and then retries or cleans up as kubelet and the
// external-provisioner would. What a failed step left behind shows in the
// counts taken afterwards.
func (p *runningPlugin) failingSteps(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ctrl, node := csi.NewControllerClient(p.conn), csi.NewNodeClient(p.conn)
	expect := func(step string, err error, want codes.Code) {
		t.Helper()
		if status.Code(err) != want {
			t.Fatalf("%s: got %v, want code %v", step, err, want)
		}
	}

	_, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "leak-huge",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 60}, VolumeCapabilities: []*csi.VolumeCapability{capBlock}})
	expect("CreateVolume larger than the node", err, codes.ResourceExhausted)

	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "leak-fail",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapabilities: []*csi.VolumeCapability{capExt4}})
	expect("CreateVolume", err, codes.OK)
	id := vol.GetVolume().GetVolumeId()
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "leak-fail",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{capExt4}})
	expect("CreateVolume of an existing name with another size", err, codes.AlreadyExists)

	// The device is attached and formatted before the mount fails; the
	// plugin must detach it again.
	_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, VolumeCapability: capExt4,
		StagingTargetPath: filepath.Join(p.dir, "no-such-dir", "staging")})
	expect("NodeStageVolume at a path whose parent does not exist", err, codes.Internal)
	if n := p.devices(t); n != 0 {
		t.Errorf("a failed NodeStageVolume left %d %s device(s) attached", n, testBackend())
	}
	staging := filepath.Join(p.dir, "staging")
	_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, VolumeCapability: capExt4,
		StagingTargetPath: staging})
	expect("NodeStageVolume retried", err, codes.OK)

	_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	expect("DeleteVolume of a staged volume", err, codes.FailedPrecondition)

	// A target that is a file where a directory belongs: the plugin
	// records the publication, fails to mount, and must undo both.
	target := filepath.Join(p.dir, "pod", "mnt")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: capExt4})
	expect("NodePublishVolume at a file", err, codes.Internal)
	if n := countLines(t, "/proc/self/mountinfo", target); n != 0 {
		t.Errorf("a failed NodePublishVolume left %d mount(s) at %s", n, target)
	}
	os.Remove(target)
	_, err = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: capExt4})
	expect("NodePublishVolume retried", err, codes.OK)
	checkFileIO(t, target, -1)

	_, err = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	expect("NodeUnstageVolume of a published volume", err, codes.FailedPrecondition)
	_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "leak-none", TargetPath: target})
	expect("NodeUnpublishVolume of an unknown volume", err, codes.NotFound)
	if n := countLines(t, "/proc/self/mountinfo", target); n != 1 {
		t.Errorf("NodeUnpublishVolume of an unknown volume at %s, where volume %s is published, left %d mounts there, want 1",
			target, id, n)
	}
	p.release(t, id, staging, target)
}

// counts measures every entry of leakCounts for the plugin and the node.
func (p *runningPlugin) counts(t *testing.T) map[string]int64 {
	t.Helper()
	pid := p.cmd.Process.Pid
	_, body := p.get(t, "/metrics") // first: its connection is then counted in fds
	c := map[string]int64{"goroutines": int64(metric(t, body, "go_goroutines "))}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	c["fds"] = int64(len(fds))
	st := procStatus(t, pid)
	c["threads"] = st["Threads"]
	c["rss"] = st["VmRSS"]
	c["mmaps"] = countLines(t, fmt.Sprintf("/proc/%d/maps", pid), "")
	c["mounts"] = countLines(t, "/proc/self/mountinfo", p.dir)
	c["devices"] = p.devices(t)
	c["data entries"] = countFiles(t, p.dataDir)
	c["device links"] = countFiles(t, filepath.Join(p.dir, "dev"))
	c["pod entries"] = countFiles(t, filepath.Join(p.dir, "pod"))
	return c
}

// procStatus returns the numeric fields of /proc/<pid>/status, sizes in bytes.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(string(b)) {
		key, val, _ := strings.Cut(line, ":")
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) == 2 && f[1] == "kB" {
			n <<= 10
		}
		out[key] = n
	}
	return out
}

// countLines counts the lines of file that contain sub.
func countLines(t *testing.T, file, sub string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// countFiles counts the files and directories below dir (none if dir
// does not exist).
func countFiles(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if path != dir {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// devices counts the block devices of the plugin's backend, whatever the
// plugin itself thinks it owns: on loop, the kernel's loop devices whose
// backing file, as sysfs names it (with " (deleted)" for an unlinked one),
// lies in the plugin's data directory; on ublk, every ublk device (the VM
// runs no other server).
func (p *runningPlugin) devices(t *testing.T) int64 {
	t.Helper()
	if testBackend() == "ublk" {
		ents, err := os.ReadDir("/sys/class/ublk-char")
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return int64(len(ents))
	}
	return int64(len(p.loopDeviceList(t)))
}

// loopDeviceList returns the paths of the loop devices devices counts.
func (p *runningPlugin) loopDeviceList(t *testing.T) []string {
	t.Helper()
	data, err := filepath.EvalSymlinks(p.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // unbound since the glob
		}
		if strings.HasPrefix(string(b), data+"/") {
			devs = append(devs, "/dev/"+strings.Split(f, "/")[3])
		}
	}
	return devs
}
