package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// These tests make the volume's backing file fail under a published raw
// volume, through the real plugin and the real kernel: the data directory
// is a small ext4 filesystem of its own, which fills up (ENOSPC) or is shut
// down (EIO, the filesystem's own shutdown ioctl, the same state a disk
// error leaves it in). The writer must get the error at once, for exactly
// the requests that failed, and the volume must go on serving the rest.

// ioLimit bounds every I/O these tests make: longer is a hang.
const ioLimit = 60 * time.Second

// alignedBuf returns n bytes of page-aligned memory for O_DIRECT, filled
// with fill.
func alignedBuf(t *testing.T, n int, fill byte) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	for i := range b {
		b[i] = fill
	}
	return b
}

// directIO is one O_DIRECT read or write of buf at off on dev, bounded by
// ioLimit: a request that does not come back in time fails the test as a
// hang. It returns the error the application sees.
func directIO(t *testing.T, dev string, write bool, buf []byte, off int64) error {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var err error
		if write {
			_, err = f.WriteAt(buf, off)
		} else {
			_, err = f.ReadAt(buf, off)
		}
		done <- err
	}()
	select {
	case err := <-done:
		f.Close()
		return err
	case <-time.After(ioLimit):
		op := "read"
		if write {
			op = "write"
		}
		t.Fatalf("a direct %s of %d bytes at %d on %s hung for %v", op, len(buf), off, dev, ioLimit)
		return nil
	}
}

// mustIO is directIO that must succeed; a read must return want.
func mustIO(t *testing.T, what, dev string, write bool, buf []byte, off int64, want byte) {
	t.Helper()
	if err := directIO(t, dev, write, buf, off); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !write && !bytes.Equal(buf, bytes.Repeat([]byte{want}, len(buf))) {
		t.Fatalf("%s: other bytes than were written", what)
	}
}

// waitLog waits for a line of the plugin's log to contain every one of parts.
func (p *runningPlugin) waitLog(t *testing.T, parts ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the plugin to log %q", parts), func() bool {
		b, err := os.ReadFile(filepath.Join(p.dir, "plugin.log"))
		if err != nil {
			return false
		}
	lines:
		for line := range strings.Lines(string(b)) {
			for _, part := range parts {
				if !strings.Contains(line, part) {
					continue lines
				}
			}
			return true
		}
		return false
	})
}

// removeUblkDevices deletes every ublk device (the VM runs no other
// server) once the plugin that served them has ended.
func removeUblkDevices(t *testing.T) {
	if testBackend() != "ublk" {
		return
	}
	ents, _ := os.ReadDir("/sys/class/ublk-char")
	if len(ents) == 0 {
		return
	}
	ctl, err := ublk.OpenControl()
	if err != nil {
		t.Errorf("clean up: %v", err)
		return
	}
	defer ctl.Close()
	for _, e := range ents {
		id, err := strconv.ParseUint(strings.TrimPrefix(e.Name(), "ublkc"), 10, 32)
		if err != nil {
			continue
		}
		if err := ctl.DelDev(uint32(id), false); err != nil {
			t.Errorf("clean up: delete ublk device %d: %v", id, err)
		}
	}
}

// dirNames lists the names below dir, relative to it, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if strings.HasPrefix(filepath.Base(rel), ".health-probe-") {
			return nil // the health check's own probe, created and removed at any time
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestFullDisk fills the data directory's filesystem under a staged,
// published raw volume, then checks: CreateVolume answers
// ResourceExhausted and leaves nothing behind; a write into the volume's
// unallocated part fails with ENOSPC at once (no hang) while writes over
// its allocated part and reads still work; the node reports the full disk
// (/healthz, without host paths); and once space is freed, the volume takes
// the write that failed and every byte written before is still there.
func TestFullDisk(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk")
	smallFS(t, disk, 128<<20)
	data := filepath.Join(disk, "data")
	p := launchOn(t, buildBinary(t), dir, data)
	id, staging, target := p.provision(t, "full-disk", 32<<20, capBlock, "dev")

	const mib = 1 << 20
	// Allocated before the disk fills: the first 4 MiB.
	mustIO(t, "write before the disk fills", target, true, alignedBuf(t, 4*mib, 0xa1), 0, 0)
	filler := filepath.Join(disk, "filler")
	n := fillUp(t, filler)
	t.Logf("the data directory's filesystem is full after %d MiB of filler", n>>20)

	// A new volume cannot be promised space: ResourceExhausted, and no
	// file or record of it remains.
	before := dirNames(t, data)
	_, err := csi.NewControllerClient(p.conn).CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "full-disk-2", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{capBlock}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreateVolume on a full disk: %v, want ResourceExhausted", err)
	}
	t.Logf("CreateVolume on a full disk: %v", err)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "available") {
		t.Errorf("CreateVolume's message %q does not say how much space there is", msg)
	}
	if after := dirNames(t, data); !slices.Equal(before, after) {
		t.Errorf("a refused CreateVolume changed the data directory:\nbefore %q\nafter  %q", before, after)
	}

	// A write into a hole needs a block the filesystem no longer has.
	start := time.Now()
	err = directIO(t, target, true, alignedBuf(t, mib, 0xb2), 16*mib)
	if err == nil {
		t.Fatal("a write into an unallocated part of the volume succeeded on a full disk")
	}
	t.Logf("write into a hole on a full disk: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("the writer got %v, want ENOSPC", err)
	}
	// The rest of the volume still works: overwrite and read back the
	// allocated part, and read the failed range (a hole: zeros).
	mustIO(t, "overwrite of allocated blocks on a full disk", target, true, alignedBuf(t, 4*mib, 0xc3), 0, 0)
	mustIO(t, "read back on a full disk", target, false, alignedBuf(t, 4*mib, 0), 0, 0xc3)
	mustIO(t, "read of the failed range", target, false, alignedBuf(t, mib, 0xff), 16*mib, 0)

	// The operator sees it: the log says the data directory is full
	// (and, where the backend counts failed requests, which volume
	// failed), and so do the metrics. /healthz stays ok: restarting the
	// plugin would not free space.
	_, body := p.get(t, "/metrics")
	if a := metric(t, body, "fastblk_node_capacity_available_bytes"); a != 0 {
		t.Errorf("fastblk_node_capacity_available_bytes = %v on a full disk, want 0", a)
	}
	p.waitLog(t, "the data directory is full")
	if testBackend() == "ublk" {
		if e := metric(t, body, fmt.Sprintf(`fastblk_volume_errors_total{device_class="default",name="full-disk",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, storeIDOf(id))); e < 1 {
			t.Errorf("fastblk_volume_errors_total = %v after a failed write, want ≥ 1", e)
		}
		p.waitLog(t, "volume I/O failed", `volumeID="`+storeIDOf(id)+`"`)
	}

	// Space comes back: the same write goes through, and nothing written
	// before is lost.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustIO(t, "write after space was freed", target, true, alignedBuf(t, mib, 0xb2), 16*mib, 0)
	mustIO(t, "read back after space was freed", target, false, alignedBuf(t, 4*mib, 0), 0, 0xc3)
	mustIO(t, "read back the new write", target, false, alignedBuf(t, mib, 0), 16*mib, 0xb2)
	p.waitLog(t, "the data directory has free space again")
	p.release(t, id, staging, target)
	if n := p.devices(t); n != 0 {
		t.Errorf("%d devices left after the volume was deleted", n)
	}
}

// shutdownFS shuts the filesystem mounted at dir down as a failed disk
// would (the ext4/xfs GOINGDOWN ioctl, without flushing its log): from then
// on every read and write of its files fails with EIO.
func shutdownFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const goingDown = 0x8004587d // _IOR('X', 125, __u32): EXT4_IOC_SHUTDOWN, XFS_IOC_GOINGDOWN
	const noLogFlush = 2         // EXT4_GOING_FLAGS_NOLOGFLUSH, XFS_FSOP_GOING_FLAGS_NOLOGFLUSH
	if err := unix.IoctlSetPointerInt(int(f.Fd()), goingDown, noLogFlush); err != nil {
		t.Fatalf("shut down the filesystem at %s: %v", dir, err)
	}
}

// TestBackingEIO shuts down the data directory's filesystem under a
// published raw volume: its reads and writes must fail with EIO at once,
// not hang and not succeed, the plugin must go on answering (and say the
// node is unhealthy), and unpublishing and unstaging must still work so
// that the node can be repaired.
func TestBackingEIO(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk")
	smallFS(t, disk, 64<<20)
	// The records cannot say the volume is gone: what the plugin leaves
	// is removed by hand, its ublk device after the plugin has ended
	// (cleanups run last first), before the filesystem is unmounted.
	var p *runningPlugin
	t.Cleanup(func() { removeUblkDevices(t) })
	p = launchOn(t, buildBinary(t), dir, filepath.Join(disk, "data"))
	t.Cleanup(func() { p.undoLeftovers(t) })
	id, staging, target := p.provision(t, "backing-eio", 16<<20, capBlock, "dev")
	const mib = 1 << 20
	mustIO(t, "write before the failure", target, true, alignedBuf(t, mib, 0x5a), 0, 0)

	shutdownFS(t, disk)
	for _, c := range []struct {
		what  string
		write bool
		off   int64
	}{
		{"read of written blocks", false, 0},
		{"overwrite", true, 0},
		{"write into a hole", true, 8 * mib},
		{"read of a hole", false, 8 * mib},
	} {
		start := time.Now()
		err := directIO(t, target, c.write, alignedBuf(t, 64<<10, 0x33), c.off)
		t.Logf("%s on a failed backing file: %v after %v", c.what, err, time.Since(start).Round(time.Millisecond))
		if !errors.Is(err, unix.EIO) {
			t.Errorf("%s on a failed backing file: %v, want EIO", c.what, err)
		}
	}
	if testBackend() == "ublk" {
		_, body := p.get(t, "/metrics")
		if e := metric(t, body, fmt.Sprintf(`fastblk_volume_errors_total{device_class="default",name="backing-eio",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, storeIDOf(id))); e < 4 {
			t.Errorf("fastblk_volume_errors_total = %v after 4 failed I/Os, want ≥ 4", e)
		}
		p.waitLog(t, "volume I/O failed", `volumeID="`+storeIDOf(id)+`"`)
	}
	// The plugin goes on answering; its error texts on the network port
	// name no host path.
	code, body := p.get(t, "/healthz")
	t.Logf("/healthz on a failed data directory: %d %q", code, body)
	if strings.Contains(body, dir) {
		t.Errorf("/healthz, served on the network, names a host path: %q", body)
	}

	// The pod goes away: unpublishing and unstaging answer at once (the
	// records cannot be written: an error kubelet retries until the disk
	// is repaired), they do not hang on the failed file.
	ctx, cancel := context.WithTimeout(context.Background(), ioLimit)
	defer cancel()
	node := csi.NewNodeClient(p.conn)
	_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	t.Logf("NodeUnpublishVolume on a failed data directory: %v", err)
	if status.Code(err) == codes.DeadlineExceeded {
		t.Fatalf("NodeUnpublishVolume hung on a failed data directory")
	}
	_, err = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	t.Logf("NodeUnstageVolume on a failed data directory: %v", err)
	if status.Code(err) == codes.DeadlineExceeded {
		t.Fatalf("NodeUnstageVolume hung on a failed data directory")
	}
}

// TestQuarantineLogSaysWhy starts the plugin on a data directory with a
// volume record that does not decode: the record is set aside, and the log
// line that asks an operator to act says why, at this start and (with a
// hint) at the next.
func TestQuarantineLogSaysWhy(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	meta := filepath.Join(dir, "data", "meta")
	if err := os.MkdirAll(meta, 0o750); err != nil {
		t.Fatal(err)
	}
	const id = "v0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(filepath.Join(meta, id+".json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t)
	p := launch(t, bin, dir)
	p.waitLog(t, "unreadable record set aside", id+".json.corrupt", "corrupt record", "invalid character")
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	p = launch(t, bin, dir)
	p.waitLog(t, "unreadable record set aside", "set aside by an earlier start")
}

// TestHealthzNamesNoPath takes the data directory away under the running
// plugin: /healthz on the network port answers 503 with what failed and
// the system error, but no host path (the log and the local /status keep
// the detail), and 200 again once the directory is back.
func TestHealthzNamesNoPath(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	p := launch(t, buildBinary(t), dir)
	waitFor(t, "/healthz", func() bool { code, _ := p.get(t, "/healthz"); return code == http.StatusOK })
	gone := p.dataDir + ".gone"
	if err := os.Rename(p.dataDir, gone); err != nil {
		t.Fatal(err)
	}
	code, body := p.get(t, "/healthz")
	t.Logf("/healthz without a data directory: %d %q", code, body)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "data directory") {
		t.Errorf("/healthz without a data directory = %d %q, want 503 naming the data directory", code, body)
	}
	if strings.Contains(body, dir) {
		t.Errorf("/healthz, served on the network, names a host path: %q", body)
	}
	if err := os.Rename(gone, p.dataDir); err != nil {
		t.Fatal(err)
	}
	if code, body := p.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the data directory back = %d %q, want 200", code, body)
	}
}
