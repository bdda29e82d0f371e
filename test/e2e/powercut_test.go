package e2e

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
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

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// The power-cut test runs in two boots of the VM on one data disk
// (hack/vm/powercut.sh). FASTBLK_POWERCUT=write: the plugin serves a raw,
// an ext4 and an xfs volume from $FASTBLK_POWERCUT_DIR; blocks written to
// the raw device with O_DIRECT and fdatasync (FLUSH), and files written and
// fsynced (with their directory) on each filesystem volume, are
// acknowledged, each then recorded with its CRC in a log fsynced on the
// data disk; more writes follow that are never flushed, and
// in the middle of them the guest kernel is reset (sysrq b: no sync, no
// unmount, the ublk server gone with everything else). FASTBLK_POWERCUT=
// verify, on the next boot: the plugin starts on the same data directory,
// the volumes are staged and published again as kubelet would after a
// reboot, and every acknowledged block and file must read back with its
// CRC. Unflushed writes went elsewhere: they may be lost, never torn into
// an acknowledged block's place.
//
// FASTBLK_POWERCUT_NOFLUSH=1 makes the write phase record its writes as
// acknowledged without flushing them (hack/vm/powercut.sh --no-flush): the
// verify phase must then find writes lost, which proves it can.

const (
	pcRawSize   = 64 << 20
	pcBlock     = 4 << 10
	pcRawStride = 16 << 10 // acknowledged blocks: one every 16 KiB, each into a hole
	pcBatch     = 32       // blocks written between two fdatasyncs
	pcFiles     = 48       // per filesystem
	pcFileSize  = 48 << 10
	pcDuration  = 10 * time.Second // of acknowledged writes before the reset
)

// pcFS are the filesystems of the volumes written with files, one volume
// each, in the order their files are written; the ack log names each
// file's filesystem.
var pcFS = []string{"ext4", "xfs"}

// pcSize is the size of the volume formatted with fs ("" for raw):
// mkfs.xfs refuses filesystems under 300 MB (xfsprogs 5.19 and later).
func pcSize(fs string) int64 {
	if fs == "xfs" {
		return 320 << 20
	}
	return pcRawSize
}

func TestPowerCut(t *testing.T) {
	phase := os.Getenv("FASTBLK_POWERCUT")
	if phase == "" {
		testgate.Skip(t, testgate.PowerCut, "FASTBLK_POWERCUT unset: run by hack/vm/powercut.sh, in two boots of the VM")
	}
	dir := os.Getenv("FASTBLK_POWERCUT_DIR")
	if dir == "" {
		t.Fatal("FASTBLK_POWERCUT_DIR unset")
	}
	bin := requireVM(t)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	p := &plugin{t: t, bin: bin, dir: dir, dataDir: filepath.Join(pcDataFS(t, dir, phase == "write"), "data"),
		devDir: filepath.Join(dir, "dev"), sock: filepath.Join(dir, "csi.sock")}
	p.start()
	raw := p.pcVolume("pc-raw", pcSize(""), blockCap())
	vols := []*volume{raw}
	mnts := map[string]string{}
	for _, fs := range pcFS {
		v := p.pcVolume("pc-"+fs, pcSize(fs), mountCap(fs))
		vols = append(vols, v)
		mnts[fs] = v.target
	}
	ack := filepath.Join(dir, "ack.log")
	switch phase {
	case "write":
		pcWrite(t, raw.target, mnts, ack)
	case "verify":
		pcVerify(t, raw.target, mnts, ack)
		for _, v := range vols {
			p.release(v)
		}
		p.stop()
	default:
		t.Fatalf("FASTBLK_POWERCUT=%q: want write or verify", phase)
	}
}

// pcDataFS mounts the data directory's own filesystem, an ext4 image on the
// data disk (made when fresh), and returns its mount point. The ack log
// stays outside it: its fsyncs commit the data disk's journal, which would
// otherwise make the volumes' unflushed backing writes durable too and
// hide a missing flush.
func pcDataFS(t *testing.T, dir string, fresh bool) string {
	t.Helper()
	img, mnt := filepath.Join(dir, "data.img"), filepath.Join(dir, "fs")
	if fresh {
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 1<<30); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4 %s: %v\n%s", img, err, out)
		}
	}
	if err := os.MkdirAll(mnt, 0o750); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", img, err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// pcVolume creates (or finds again: CreateVolume is idempotent), stages
// and publishes volume name of size bytes at fixed paths, as kubelet does
// at first and again after a reboot.
func (p *plugin) pcVolume(name string, size int64, c *csi.VolumeCapability) *volume {
	p.t.Helper()
	ctx := context.Background()
	cr, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c}})
	if err != nil {
		p.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := &volume{id: cr.GetVolume().GetVolumeId(), cap: c,
		staging: filepath.Join(p.dir, "staging", name), target: filepath.Join(p.dir, "pods", name, "target")}
	if err := os.MkdirAll(v.staging, 0o750); err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
		VolumeCapability: c}); err != nil {
		p.t.Fatalf("NodeStageVolume %s: %v\n%s", name, err, p.logTail())
	}
	if _, err := p.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
		TargetPath: v.target, VolumeCapability: c}); err != nil {
		p.t.Fatalf("NodePublishVolume %s: %v\n%s", name, err, p.logTail())
	}
	return v
}

// ackLog appends acknowledged writes to a log on the data disk, durable
// before the next write is made.
type ackLog struct {
	f *os.File
	n int
}

func (l *ackLog) add(t *testing.T, lines ...string) {
	t.Helper()
	if _, err := l.f.WriteString(strings.Join(lines, "")); err != nil {
		t.Fatal(err)
	}
	if err := l.f.Sync(); err != nil {
		t.Fatal(err)
	}
	l.n += len(lines)
}

// pcWrite writes acknowledged blocks to the raw device dev and files to
// each filesystem mounted at mnts (filesystem -> mount point), recording
// them in the ack log, then unflushed ones, and resets the kernel.
func pcWrite(t *testing.T, dev string, mnts map[string]string, ackPath string) {
	flush := os.Getenv("FASTBLK_POWERCUT_NOFLUSH") == ""
	f, err := os.OpenFile(ackPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	log := &ackLog{f: f}
	rawf, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, pcBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	start := time.Now()
	deadline := start.Add(pcDuration)
	var rawBytes int64
	files := 0 // per filesystem
	// Acknowledged raw blocks and files, interleaved, for pcDuration.
	for off := int64(0); time.Now().Before(deadline) && off+pcBatch*pcRawStride <= pcRawSize; {
		var lines []string
		for range pcBatch {
			fillRand(rng, buf)
			if _, err := rawf.WriteAt(buf, off); err != nil {
				t.Fatalf("raw write at %d: %v", off, err)
			}
			lines = append(lines, fmt.Sprintf("raw %d %08x\n", off, crc32.ChecksumIEEE(buf)))
			off += pcRawStride
		}
		if flush {
			if err := unix.Fdatasync(int(rawf.Fd())); err != nil {
				t.Fatalf("fdatasync %s: %v", dev, err)
			}
		}
		log.add(t, lines...)
		rawBytes += pcBatch * pcBlock
		// Files spread over pcDuration: the last are younger than a
		// filesystem's own periodic commit (ext4's is 5 s), which would
		// otherwise make them durable without a flush and blind the
		// --no-flush self-check.
		if files < pcFiles && time.Since(start) >= time.Duration(files)*pcDuration/pcFiles {
			for _, fs := range pcFS {
				name, crc := pcFile(t, mnts[fs], files, rng, flush)
				log.add(t, fmt.Sprintf("%s %s %08x\n", fs, name, crc))
			}
			files++
		}
	}
	t.Logf("acknowledged: %d raw blocks (%d KiB), %d files (%d KiB) on each of %s, %d log lines",
		rawBytes/pcBlock, rawBytes>>10, files, files*pcFileSize>>10, strings.Join(pcFS, " and "), log.n)
	// Unflushed writes, between the acknowledged blocks and to new files,
	// still going when the kernel is reset.
	go func() {
		b, _ := unix.Mmap(-1, 0, pcBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		for i := 0; ; i++ {
			fillRand(rng, b)
			rawf.WriteAt(b, int64(i%(pcRawSize/pcRawStride))*pcRawStride+pcRawStride/2)
			for _, fs := range pcFS {
				os.WriteFile(filepath.Join(mnts[fs], fmt.Sprintf("unflushed-%d", i)), b, 0o600)
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if err := os.WriteFile("/proc/sys/kernel/sysrq", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	// hack/vm/run.sh --expect-reset takes this line as the reset asked for.
	fmt.Printf("@@FASTBLK-VM-RESET %s@@\n", os.Getenv("FASTBLK_VM_NONCE"))
	// Let the console drain (the reset drops what its tty still holds);
	// the unflushed writes go on meanwhile.
	time.Sleep(time.Second)
	if err := os.WriteFile("/proc/sysrq-trigger", []byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Second)
	t.Fatal("the guest was not reset")
}

// pcFile writes file number i of the filesystem mounted at mnt, fsyncs it
// and its directory (unless flush is false), and returns its name and CRC.
func pcFile(t *testing.T, mnt string, i int, rng *rand.Rand, flush bool) (string, uint32) {
	t.Helper()
	name := fmt.Sprintf("acked-%03d", i)
	b := make([]byte, pcFileSize)
	fillRand(rng, b)
	f, err := os.OpenFile(filepath.Join(mnt, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !flush {
		return name, crc32.ChecksumIEEE(b)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	return name, crc32.ChecksumIEEE(b)
}

func fillRand(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

// pcCount is what pcVerify found of one kind of acknowledged write: raw
// blocks, or the files of one filesystem.
type pcCount struct {
	n, bad int
	bytes  int64
}

// pcVerify reads back every write the ack log lists: raw blocks from dev,
// files from the filesystems mounted at mnts (filesystem -> mount point).
func pcVerify(t *testing.T, dev string, mnts map[string]string, ackPath string) {
	f, err := os.Open(ackPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rawf, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rawf.Close()
	buf, err := unix.Mmap(-1, 0, pcBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	kinds := append([]string{"raw"}, pcFS...)
	counts := map[string]*pcCount{}
	for _, k := range kinds {
		counts[k] = &pcCount{}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || counts[fields[0]] == nil {
			t.Fatalf("ack log line %q", sc.Text())
		}
		want, err := strconv.ParseUint(fields[2], 16, 32)
		if err != nil {
			t.Fatalf("ack log line %q: %v", sc.Text(), err)
		}
		kind, c := fields[0], counts[fields[0]]
		var got uint32
		if kind == "raw" {
			off, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("ack log line %q: %v", sc.Text(), err)
			}
			if _, err := rawf.ReadAt(buf, off); err != nil {
				t.Fatalf("read %s at %d: %v", dev, off, err)
			}
			got = crc32.ChecksumIEEE(buf)
			c.bytes += pcBlock
		} else {
			b, err := os.ReadFile(filepath.Join(mnts[kind], fields[1]))
			if err != nil {
				// hack/vm/powercut.sh --no-flush counts these lines.
				t.Errorf("acknowledged file %s/%s: %v", kind, fields[1], err)
				c.n++
				c.bad++
				continue
			}
			got = crc32.ChecksumIEEE(b)
			c.bytes += int64(len(b))
		}
		c.n++
		if got != uint32(want) {
			c.bad++
			// hack/vm/powercut.sh --no-flush counts these lines too.
			t.Errorf("acknowledged %s %s: CRC %08x after the reset, %08x written", kind, fields[1], got, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, k := range kinds {
		c, what := counts[k], "files"
		if k == "raw" {
			what = "blocks"
		}
		report = append(report, fmt.Sprintf("%s %d %s (%d KiB, %d bad)", k, c.n, what, c.bytes>>10, c.bad))
	}
	t.Logf("verified after the reset: %s", strings.Join(report, ", "))
	for _, k := range kinds {
		if counts[k].n == 0 {
			t.Fatalf("the ack log lists no %s writes: the write phase did not run", k)
		}
	}
}
