package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// TestMain fails the package when a test left ublk devices behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if ents, err := os.ReadDir("/sys/class/ublk-char"); err == nil && len(ents) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: %d ublk devices left after the tests\n", len(ents))
		code = 1
	}
	os.Exit(code)
}

func fioPath() string {
	if _, err := os.Stat("/usr/bin/fio"); err == nil {
		return "/usr/bin/fio"
	}
	return "fio"
}

// fioVerify returns a fio command writing size bytes of 4k random writes
// to file and verifying them with crc32c (verifyOnly: verify only). The
// random map stays on: each block is written once, so no two writes to one
// block are ever in flight together (their order would be undefined).
func fioVerify(file, size string, verifyOnly bool) *exec.Cmd {
	args := []string{"--name=verify", "--filename=" + file, "--rw=randwrite", "--bs=4k", "--size=" + size,
		"--direct=1", "--ioengine=libaio", "--iodepth=16", "--verify=crc32c", "--verify_fatal=1",
		"--do_verify=1", "--randrepeat=1"}
	if verifyOnly {
		args = append(args, "--verify_only")
	}
	return exec.Command(fioPath(), args...)
}

func runFio(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "verify: bad") {
		t.Fatalf("fio %v: %v\n%s", cmd.Args, err, out)
	}
	t.Logf("fio ok: %s %s", lastLine(string(out), "WRITE:"), lastLine(string(out), "READ:"))
}

func lastLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func TestFioVerifyRawBlock(t *testing.T) {
	p := newPlugin(t)
	v := p.provision("raw", 128<<20, blockCap(), map[string]string{"queues": "2", "queueDepth": "32"})
	runFio(t, fioVerify(v.target, "96M", false))
	// The queue threads' own measurements reach /metrics.
	labels := fmt.Sprintf(`{device_class="default",name="raw",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, v.storeID())
	if n := p.metric("fastblk_volume_io_latency_seconds_count" + labels); n < 1000 {
		t.Errorf("latency histogram counted %v I/Os after a 96 MiB fio run", n)
	}
	if q := p.metric("fastblk_volume_queues" + labels); q != 2 {
		t.Errorf("queues metric = %v, want 2 (the StorageClass parameter)", q)
	}
}

// TestMaxIOSize proves the maxIOSize parameter reaches the kernel: the
// device takes 256 KiB requests in copy mode and with user copy (1 MiB
// with zero copy, which ignores it), /metrics reports the same, and 1 MiB
// sequential I/O split into such requests verifies.
func TestMaxIOSize(t *testing.T) {
	p := newPlugin(t)
	v := p.provision("maxio", 128<<20, blockCap(), map[string]string{"queues": "1", "queueDepth": "16", "maxIOSize": "256Ki"})
	kb := maxHWSectorsKB(t, p.devLink(v))
	if kb != 256 && kb != 1024 {
		t.Fatalf("%s max_hw_sectors_kb = %d, want 256 (copy mode, user copy) or 1024 (zero copy)", p.devLink(v), kb)
	}
	labels := fmt.Sprintf(`{device_class="default",name="maxio",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, v.storeID())
	if m := p.metric("fastblk_volume_max_io_bytes" + labels); m != float64(kb<<10) {
		t.Errorf("max i/o metric = %v, want the kernel's %d KiB", m, kb)
	}
	runFio(t, exec.Command(fioPath(), "--name=seq", "--filename="+v.target, "--rw=write", "--bs=1M", "--size=96M",
		"--direct=1", "--ioengine=libaio", "--iodepth=8", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1"))
}

// TestFioVerifyFilesystem verifies fio's writes through ext4 on a volume
// of the default configuration, which takes 1 MiB requests on every kernel
// the VM boots (user copy on 6.12, zero copy on 7.3).
func TestFioVerifyFilesystem(t *testing.T) {
	p := newPlugin(t)
	v := p.provision("fs", 256<<20, mountCap("ext4"), nil)
	if kb := maxHWSectorsKB(t, p.devLink(v)); kb != 1024 {
		t.Errorf("%s max_hw_sectors_kb = %d, want 1024: a default volume takes 1 MiB requests", p.devLink(v), kb)
	}
	runFio(t, fioVerify(filepath.Join(v.target, "fio.dat"), "96M", false))
}

// TestRecoveryKill9 kills the plugin with fio verify running on a raw and
// a mounted volume, restarts it, and expects both fio runs to finish
// without errors and the data to verify again afterwards.
func TestRecoveryKill9(t *testing.T) {
	p := newPlugin(t)
	raw := p.provision("rec-raw", 128<<20, blockCap(), nil)
	fs := p.provision("rec-fs", 256<<20, mountCap("ext4"), nil)
	files := []string{raw.target, filepath.Join(fs.target, "fio.dat")}
	var runs []*exec.Cmd
	var outs []*strings.Builder
	for _, f := range files {
		cmd := fioVerify(f, "96M", false)
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		runs, outs = append(runs, cmd), append(outs, out)
	}
	waitWrites(t, p.devLink(raw), 2000)
	p.kill9()
	t.Logf("plugin killed with I/O in flight; ublk devices: %v", ublkDevices(t))
	p.start()
	for i, cmd := range runs {
		if err := waitCmd(cmd, 10*time.Minute); err != nil || strings.Contains(outs[i].String(), "verify: bad") {
			t.Fatalf("fio on %s after recovery: %v\n%s", files[i], err, outs[i])
		}
	}
	for _, f := range files {
		runFio(t, fioVerify(f, "96M", true))
	}
	if n := p.metric(fmt.Sprintf(`fastblk_volume_recoveries_total{device_class="default",name="rec-raw",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, raw.storeID())); n != 1 {
		t.Errorf("recoveries metric = %v after one kill -9, want 1", n)
	}
}

// waitWrites polls the device's write counter until it passes n.
func waitWrites(t *testing.T, link string, n int64) {
	t.Helper()
	dev, err := filepath.EvalSymlinks(link)
	if err != nil {
		t.Fatal(err)
	}
	stat := filepath.Join("/sys/block", filepath.Base(dev), "stat")
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if w, _ := strconv.ParseInt(f[4], 10, 64); w >= n {
			return
		}
		<-time.After(20 * time.Millisecond)
	}
	t.Fatalf("%s: fewer than %d writes in 2 minutes", dev, n)
}

func waitCmd(cmd *exec.Cmd, limit time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("still running after %s", limit)
	}
}

// TestDiscardFreesSpace checks that BLKDISCARD on a raw volume and FITRIM
// on a mounted one punch holes in the backing file.
func TestDiscardFreesSpace(t *testing.T) {
	p := newPlugin(t)
	t.Run("blkdiscard", func(t *testing.T) {
		v := p.provision("discard-raw", 128<<20, blockCap(), nil)
		fill(t, v.target, 64<<20)
		before := blocks(t, p.backingFile(v))
		fd, err := unix.Open(v.target, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		rng := [2]uint64{0, 128 << 20}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng))); e != 0 {
			t.Fatalf("BLKDISCARD: %v", e)
		}
		checkShrunk(t, p.backingFile(v), before)
	})
	t.Run("fstrim", func(t *testing.T) {
		v := p.provision("discard-fs", 256<<20, mountCap("ext4"), nil)
		data := filepath.Join(v.target, "data")
		fill(t, data, 64<<20)
		before := blocks(t, p.backingFile(v))
		if err := os.Remove(data); err != nil {
			t.Fatal(err)
		}
		unix.Sync()
		fd, err := unix.Open(v.target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		const fitrim = 0xc0185879 // _IOWR('X', 121, struct fstrim_range)
		rng := [3]uint64{0, ^uint64(0), 0}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fitrim, uintptr(unsafe.Pointer(&rng))); e != 0 {
			t.Fatalf("FITRIM: %v", e)
		}
		checkShrunk(t, p.backingFile(v), before)
	})
}

// fill writes n bytes of non-zero data to path with O_DIRECT and syncs.
func fill(t *testing.T, path string, n int) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i) | 1
	}
	for off := 0; off < n; off += len(buf) {
		if _, err := unix.Pwrite(fd, buf, int64(off)); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
}

func blocks(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func checkShrunk(t *testing.T, file string, before int64) {
	t.Helper()
	after := blocks(t, file)
	t.Logf("backing file allocation %d → %d bytes", before, after)
	if after > before-48<<20 {
		t.Fatalf("discard freed %d bytes of %d; want at least 48 MiB", before-after, before)
	}
}

// TestOnlineExpansion grows a mounted volume: device and filesystem grow
// where the kernel has UPDATE_SIZE; FailedPrecondition elsewhere.
func TestOnlineExpansion(t *testing.T) {
	p := newPlugin(t)
	v := p.provision("grow", 256<<20, mountCap("ext4"), nil)
	ctx := context.Background()
	const newSize = 512 << 20
	if _, err := p.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}}); err != nil {
		t.Fatalf("ControllerExpandVolume: %v", err)
	}
	var before unix.Statfs_t
	unix.Statfs(v.target, &before)
	_, err := p.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: v.id, VolumePath: v.target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}, VolumeCapability: v.cap})
	features, ferr := ublk.HaveUblk()
	if ferr != nil {
		t.Fatal(ferr)
	}
	if features&ublk.FlagUpdateSize == 0 {
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("NodeExpandVolume without UPDATE_SIZE = %v, want FailedPrecondition", err)
		}
		testgate.Without(t, testgate.UpdateSize, "kernel lacks UPDATE_SIZE: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("NodeExpandVolume: %v\n%s", err, p.logTail())
	}
	if size := deviceSize(t, p.devLink(v)); size != newSize {
		t.Fatalf("device size %d, want %d", size, newSize)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(v.target, &after); err != nil {
		t.Fatal(err)
	}
	if after.Blocks < before.Blocks*3/2 {
		t.Fatalf("filesystem %d → %d blocks; want it to grow", before.Blocks, after.Blocks)
	}
}

func deviceSize(t *testing.T, path string) int64 {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		t.Fatalf("BLKGETSIZE64 %s: %v", path, e)
	}
	return int64(size)
}

// TestManyVolumes attaches as many volumes as a node takes by default
// (--max-volumes-per-node 64) to one plugin, writes and reads back 1 MiB on
// each, and measures what they cost: the plugin's resident memory and
// threads (at most a thread and its 4 io-wq workers per volume), then detaches them all
// (which once panicked the server threads: see TestDetachForgetsQueue). Each volume must stay within its copy-buffer budget (16 MiB)
// plus 2 MiB for its rings, descriptors and bookkeeping; in copy mode it
// costs far less, as only the registered heads of its buffers (as much of
// the first 16 KiB of each tag's buffer as its requests used) stay
// resident.
func TestManyVolumes(t *testing.T) {
	const n = 64
	p := newPlugin(t)
	rss0, threads0 := p.usage()
	start := time.Now()
	vols := make([]*volume, n)
	for i := range vols {
		vols[i] = p.provision(fmt.Sprintf("many-%02d", i), 16<<20, blockCap(), nil)
	}
	attach := time.Since(start)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i) | 1 // what fill writes
	}
	for _, v := range vols {
		fill(t, v.target, len(want))
		if got := readDirect(t, v.target, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("volume %s: 1 MiB read back differs from what was written", v.id)
		}
	}
	if devs := ublkDevices(t); len(devs) < n {
		t.Fatalf("%d ublk devices with %d volumes staged", len(devs), n)
	}
	rss, threads := p.usage()
	perVol := (rss - rss0) / n
	t.Logf("%d volumes attached in %v: plugin RSS %d MiB -> %d MiB (%.1f MiB per volume), threads %d -> %d",
		n, attach.Round(time.Second), rss0>>20, rss>>20, float64(perVol)/(1<<20), threads0, threads)
	if perVol > 18<<20 {
		t.Errorf("each attached volume costs %.1f MiB of plugin memory, want at most 18 MiB (16 MiB buffers + 2 MiB)",
			float64(perVol)/(1<<20))
	}
	// A server thread per device (the default): each volume costs at most
	// its thread and its 4 io-wq workers, whatever its queues (a thread
	// per queue made 64 volumes cost 256 threads, and their io-wq workers
	// on top); the Go runtime's threads come and go (16).
	if most := threads0 + n*(1+4) + 16; threads > most {
		t.Errorf("plugin threads %d -> %d with %d volumes, want at most %d", threads0, threads, n, most)
	}
	if maxHWSectorsKB(t, p.devLink(vols[0])) == 1024 {
		return // zero copy: no buffers, nothing to reclaim
	}
	// Copy mode: each 1 MiB read and write went through 8 tag buffers,
	// whose pages past the registered heads (~0.9 MiB per volume) the
	// queues give back after 10 s idle.
	deadline := time.Now().Add(40 * time.Second)
	for {
		idle, _ := p.usage()
		if rss-idle >= n<<19 {
			t.Logf("after the idle reclaim: plugin RSS %d MiB (%.1f MiB per volume)", idle>>20, float64(idle-rss0)/n/(1<<20))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin RSS %d MiB 40 s after the I/O, want at least %d MiB less than %d MiB (idle reclaim)",
				idle>>20, n>>1, rss>>20)
		}
		time.Sleep(time.Second)
	}
}

// maxHWSectorsKB is the largest request, in KiB, of the device behind link:
// the copy-mode buffer size, or 1024 with zero copy.
func maxHWSectorsKB(t *testing.T, link string) int {
	t.Helper()
	dev, err := filepath.EvalSymlinks(link)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue/max_hw_sectors_kb"))
	if err != nil {
		t.Fatal(err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("%s max_hw_sectors_kb = %q: %v", dev, raw, err)
	}
	return kb
}

// usage returns the plugin's resident memory in bytes and its thread count.
func (p *plugin) usage() (rss int64, threads int) {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "VmRSS:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		case len(f) >= 2 && f[0] == "Threads:":
			threads, _ = strconv.Atoi(f[1])
		}
	}
	return rss, threads
}

// readDirect reads the first n bytes of path with O_DIRECT.
func readDirect(t *testing.T, path string, n int) []byte {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	if got, err := unix.Pread(fd, buf, 0); err != nil || got != n {
		t.Fatalf("read %s: %d bytes, %v", path, got, err)
	}
	return bytes.Clone(buf)
}

// TestPidsLimitHoldsManyVolumes starts the plugin in a cgroup whose
// pids.max leaves room for 24 more tasks, where a thread per queue (two
// threads per queue, 4 per volume) held 6 volumes, and proves that server
// threads start only within the pids room (a volume's own thread needs
// room for it and its io-wq workers beside a reserve; past it volumes
// share threads): 16 volumes stage and serve I/O, the thread count stays
// bounded, NodeGetInfo keeps the configured volume count, and a kill -9
// and restart under the same limit re-adopts every volume with its data.
func TestPidsLimitHoldsManyVolumes(t *testing.T) {
	requireVM(t)
	const n = 16
	dir, fd := pidsCgroup(t, 400)
	p := newPluginIn(t, fd)
	idle := readInt(t, filepath.Join(dir, "pids.current"))
	limit := idle + 24
	setPidsMax(t, dir, limit)
	info, err := p.node.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetMaxVolumesPerNode(); got != 64 {
		t.Errorf("max volumes per node = %d under pids.max %d, want the configured 64: volumes cost no thread", got, limit)
	}
	_, threads0 := p.usage()
	var vols []*volume
	for i := range n {
		v := p.provision(fmt.Sprintf("pids-%d", i), 32<<20, blockCap(), nil)
		fill(t, p.devLink(v), 1<<20)
		vols = append(vols, v)
	}
	_, threads := p.usage()
	t.Logf("pids.max %d (%d tasks idle): %d volumes staged, plugin threads %d -> %d", limit, idle, n, threads0, threads)
	// Each volume may start its own server thread with up to 4 io-wq
	// workers only while the limit leaves room for them beside a reserve;
	// past it volumes share threads. The Go runtime's threads come and
	// go; a thread per volume regardless of the limit would have added 80.
	if threads > threads0+16 {
		t.Errorf("plugin threads %d -> %d for %d volumes under pids.max %d: volumes must share threads past the pids room", threads0, threads, n, limit)
	}
	p.kill9()
	p.start()
	for _, v := range vols {
		if b := readDirect(t, p.devLink(v), 4096); b[2] != 3 { // fill writes byte(i) | 1
			t.Fatalf("re-adopted volume %s reads back %#x at byte 2, want 3\n%s", v.id, b[2], p.logTail())
		}
	}
}

// pidsCgroup makes a cgroup v2 child with the pids controller and pids.max
// limit, and returns its directory and an open fd for CLONE_INTO_CGROUP.
func pidsCgroup(t *testing.T, limit int64) (string, int) {
	t.Helper()
	const root = "/sys/fs/cgroup"
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+pids"), 0o644); err != nil {
		testgate.Skip(t, testgate.Cgroup, "no pids controller for child cgroups: %v", err)
	}
	dir := filepath.Join(root, "e2e-pids")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	setPidsMax(t, dir, limit)
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the plugin stops before the cgroup goes.
	t.Cleanup(func() { unix.Close(fd); os.Remove(dir) })
	return dir, fd
}

func setPidsMax(t *testing.T, dir string, limit int64) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readInt(t *testing.T, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return n
}
