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
)

// The power-cut test runs in two boots of the VM on one data disk
// (hack/vm/powercut.sh). FASTBLK_POWERCUT=write: the plugin serves a raw
// and an ext4 volume from $FASTBLK_POWERCUT_DIR; blocks written to the raw
// device with O_DIRECT and fdatasync, and files written and fsynced on the
// ext4 volume, are acknowledged, each then recorded with its CRC in a log
// fsynced on the data disk; more writes follow that are never flushed, and
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
	pcFiles     = 48
	pcFileSize  = 48 << 10
	pcDuration  = 10 * time.Second // of acknowledged writes before the reset
)

func TestPowerCut(t *testing.T) {
	phase := os.Getenv("FASTBLK_POWERCUT")
	if phase == "" {
		t.Skip("FASTBLK_POWERCUT unset: run by hack/vm/powercut.sh, in two boots of the VM")
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
	raw := p.pcVolume("pc-raw", blockCap())
	fs := p.pcVolume("pc-ext4", mountCap("ext4"))
	ack := filepath.Join(dir, "ack.log")
	switch phase {
	case "write":
		pcWrite(t, raw.target, fs.target, ack)
	case "verify":
		pcVerify(t, raw.target, fs.target, ack)
		p.release(raw)
		p.release(fs)
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
		if err := os.Truncate(img, 512<<20); err != nil {
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
// and publishes volume name at fixed paths, as kubelet does at first and
// again after a reboot.
func (p *plugin) pcVolume(name string, c *csi.VolumeCapability) *volume {
	p.t.Helper()
	ctx := context.Background()
	cr, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pcRawSize}, VolumeCapabilities: []*csi.VolumeCapability{c}})
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

func pcWrite(t *testing.T, dev, mnt, ackPath string) {
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
	deadline := time.Now().Add(pcDuration)
	var rawBytes, fileBytes int64
	// Acknowledged raw blocks and files, interleaved, for pcDuration.
	for off, file := int64(0), 0; time.Now().Before(deadline) && off+pcBatch*pcRawStride <= pcRawSize; {
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
		if file < pcFiles {
			name, crc := pcFile(t, mnt, file, rng, flush)
			log.add(t, fmt.Sprintf("file %s %08x\n", name, crc))
			fileBytes += pcFileSize
			file++
		}
	}
	t.Logf("acknowledged: %d raw blocks (%d KiB) and files (%d KiB), %d log lines", rawBytes/pcBlock, rawBytes>>10, fileBytes>>10, log.n)
	// Unflushed writes, between the acknowledged blocks and to new files,
	// still going when the kernel is reset.
	go func() {
		b, _ := unix.Mmap(-1, 0, pcBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		for i := 0; ; i++ {
			fillRand(rng, b)
			rawf.WriteAt(b, int64(i%(pcRawSize/pcRawStride))*pcRawStride+pcRawStride/2)
			os.WriteFile(filepath.Join(mnt, fmt.Sprintf("unflushed-%d", i)), b, 0o600)
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

// pcFile writes file number i of the ext4 volume, fsyncs it and its
// directory, and returns its name and CRC.
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

func pcVerify(t *testing.T, dev, mnt, ackPath string) {
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
	var blocks, files, bad int
	var bytes int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			t.Fatalf("ack log line %q", sc.Text())
		}
		want, err := strconv.ParseUint(fields[2], 16, 32)
		if err != nil {
			t.Fatalf("ack log line %q: %v", sc.Text(), err)
		}
		var got uint32
		switch fields[0] {
		case "raw":
			off, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("ack log line %q: %v", sc.Text(), err)
			}
			if _, err := rawf.ReadAt(buf, off); err != nil {
				t.Fatalf("read %s at %d: %v", dev, off, err)
			}
			got = crc32.ChecksumIEEE(buf)
			blocks++
			bytes += pcBlock
		case "file":
			b, err := os.ReadFile(filepath.Join(mnt, fields[1]))
			if err != nil {
				t.Errorf("acknowledged file %s: %v", fields[1], err)
				bad++
				continue
			}
			got = crc32.ChecksumIEEE(b)
			files++
			bytes += int64(len(b))
		default:
			t.Fatalf("ack log line %q", sc.Text())
		}
		if got != uint32(want) {
			bad++
			t.Errorf("acknowledged %s %s: CRC %08x after the reset, %08x written", fields[0], fields[1], got, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if blocks == 0 || files == 0 {
		t.Fatalf("the ack log lists %d raw blocks and %d files: the write phase did not run", blocks, files)
	}
	t.Logf("verified after the reset: %d acknowledged raw blocks and %d files, %d KiB, %d bad", blocks, files, bytes>>10, bad)
}
