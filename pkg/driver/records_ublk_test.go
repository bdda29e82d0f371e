package driver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// The change records at their boundaries (issue 51), on real devices: a
// restart onto another backend, and the differential test of every delta
// against the bytes of the snapshots through restarts, backend changes, a
// failed snapshot and a stop during a snapshot. The VM runs them (hack/vm
// step 46); the mounted volume's hold is in records_failpoint_test.go.

// podDevice is a pod's open raw block device: O_DIRECT, from page-aligned
// memory.
type podDevice struct {
	t   *testing.T
	fd  int
	buf []byte
}

func openPod(t *testing.T, path string) *podDevice {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	p := &podDevice{t: t, fd: fd, buf: buf}
	t.Cleanup(p.close)
	return p
}

func (p *podDevice) close() {
	if p.fd >= 0 {
		unix.Close(p.fd)
		unix.Munmap(p.buf)
		p.fd = -1
	}
}

// write writes n bytes (a multiple of 4 KiB, at most 1 MiB) of seed at off.
func (p *podDevice) write(off int64, n int, seed byte) {
	p.t.Helper()
	for i := range p.buf[:n] {
		p.buf[i] = seed + byte(i/4096)
	}
	if got, err := unix.Pwrite(p.fd, p.buf[:n], off); err != nil || got != n {
		p.t.Fatalf("pod write of %d bytes at %d: %d, %v", n, off, got, err)
	}
}

// ioctlRange discards (BLKDISCARD) or zeroes (BLKZEROOUT) [off, off+n).
func (p *podDevice) ioctlRange(req uint, off, n int64) {
	p.t.Helper()
	r := [2]uint64{uint64(off), uint64(n)}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(p.fd), uintptr(req), uintptr(unsafe.Pointer(&r))); e != 0 {
		p.t.Fatalf("ioctl %#x of [%d, +%d): %v", req, off, n, e)
	}
}

// stageBlock stages and publishes vol on n for raw block access at fixed
// paths under n's directory (the same for every node of the directory)
// and returns the target. Unlike testNode.stage it registers no cleanup:
// the tests here restart the node, and unstage with the current one.
func stageBlock(t *testing.T, n *metadataNode, vol string) string {
	t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(n.dir, "staging-"+vol), filepath.Join(n.dir, "target-"+vol)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: blockCap(snw)}); err != nil {
		t.Fatalf("stage %s on %s: %v", vol, n.backend.Name(), err)
	}
	if _, err := n.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: blockCap(snw)}); err != nil {
		t.Fatalf("publish %s on %s: %v", vol, n.backend.Name(), err)
	}
	return target
}

// unstageBlock undoes stageBlock on n.
func unstageBlock(t *testing.T, n *metadataNode, vol string) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: filepath.Join(n.dir, "target-"+vol)}); err != nil {
		t.Errorf("unpublish %s on %s: %v", vol, n.backend.Name(), err)
	}
	if _, err := n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: filepath.Join(n.dir, "staging-"+vol)}); err != nil {
		t.Errorf("unstage %s on %s: %v", vol, n.backend.Name(), err)
	}
}

// snapshotFile is the file of the snapshot of CSI ID id on n.
func (n *metadataNode) snapshotFile(id string) string {
	return filepath.Join(n.dir, "data", "snapshots", storeVolumeID(id)+blockdev.ImageSuffix)
}

// checkNoMiss asks n for the delta between two snapshots over gRPC and
// fails the test when it leaves out a block in which their files differ.
// It returns how the store found it.
func checkNoMiss(t *testing.T, n *metadataNode, base, target, what string) store.DeltaMethod {
	t.Helper()
	ctx := context.Background()
	_, tracked := n.d.backend.(changeTracker)
	_, size, how, err := n.d.store.Delta(ctx, storeVolumeID(base), storeVolumeID(target), tracked)
	if err != nil {
		t.Fatal(err)
	}
	r, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
	if err != nil {
		t.Fatalf("%s: GetMetadataDelta: %v", what, err)
	}
	got := r.all()
	diff, err := cbt.Compare(ctx, n.snapshotFile(base), n.snapshotFile(target), size)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range diff {
		if cbt.Total(cbt.Clip(got, e.Offset, e.End())) != e.Length {
			t.Errorf("%s: the delta (%s) %v misses the changed range %v (the files differ in %v)", what, how, got, e, diff)
			break
		}
	}
	return how
}

// TestRestartOnAnotherBackendKeepsTheDeviceInUse is issue 51's defect 1:
// a raw block volume staged and published through a loop device, the
// plugin restarted with ublk while the pod keeps writing through the loop
// device. The restart must not put a second device on the volume's file
// nor point the volume's link at one; snapshots taken after it hold the
// device the pod writes to, and no delta misses the pod's writes. Staged
// again, the volume moves to ublk, its loop device gone, and the first
// delta there still covers what was written through loop.
func TestRestartOnAnotherBackendKeepsTheDeviceInUse(t *testing.T) {
	testgate.RequireUblk(t)
	ctx := context.Background()
	dir := mountXFS(t) // reflink: a raw block loop volume in use can be copied
	n := serveMetadata(t, newTestNodeWith(t, dir, "n1", "loop"))
	vol := n.create("pvc-switch", 64*mib, nil)
	target := stageBlock(t, n, vol)
	link := filepath.Join(dir, "dev", storeVolumeID(vol))
	loopDev, err := os.Readlink(link)
	if err != nil {
		t.Fatal(err)
	}
	pod := openPod(t, target)
	pod.write(0, 64<<10, 1)
	cur := n // the node the volume is unstaged with at the end
	// (deferred: before the nodes' cleanups close their backends)
	defer func() { pod.close(); unstageBlock(t, cur, vol) }()

	n2 := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	cur = n2
	if err := n2.d.Reconcile(ctx); err != nil {
		t.Errorf("reconcile after the backend change: %v", err)
	}
	s1 := n2.snapshot("switch-s1", vol)
	pod.write(8*mib, 64<<10, 2)
	pod.write(40*mib+4096, 4096, 3)
	s2 := n2.snapshot("switch-s2", vol)
	checkNoMiss(t, n2, s1, s2, "after the restart onto ublk")
	if got, err := os.Readlink(link); err != nil || got != loopDev {
		t.Errorf("the volume's link leads to %q (%v) after the restart, want the pod's device %s", got, err, loopDev)
	}
	devs, err := n2.backend.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.VolumeID == storeVolumeID(vol) {
			t.Errorf("the restart attached a second device %s to the volume in use on %s", d.Path, loopDev)
		}
	}

	// Unstaged and staged again (the pod restarts): ublk serves it, the
	// loop device is gone.
	pod.close()
	unstageBlock(t, n2, vol)
	all, err := loop.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range all {
		if strings.Contains(d.BackingFile, storeVolumeID(vol)) || d.Path == loopDev && strings.Contains(d.Mark, storeVolumeID(vol)) {
			t.Errorf("loop device %s of the volume left after its unstage (backing %s)", d.Path, d.BackingFile)
		}
	}
	pod = openPod(t, stageBlock(t, n2, vol))
	pod.write(20*mib, 4096, 4)
	s3 := n2.snapshot("switch-s3", vol)
	checkNoMiss(t, n2, s2, s3, "staged again on ublk")
	checkNoMiss(t, n2, s1, s3, "across the move")
}

// TestDeltaNeverMissesAChange is the differential test of the change
// records through the driver, on a raw block volume of ublk devices (and
// loop ones in between): rounds of random writes, discards and zero-outs
// through the pod's device (O_DIRECT), each ended by a snapshot, with
// between rounds at random a rollout (the stop hands the records over), a
// crash (it does not), a move to loop and a restart onto ublk with the
// volume still on loop (a backend change each way), a snapshot that fails
// after its cut, and a stop while a snapshot runs. Every delta from the
// previous snapshot and from the first, as GetMetadataDelta answers it,
// must cover every block in which the two snapshot files differ. How many
// came from the records is logged.
func TestDeltaNeverMissesAChange(t *testing.T) {
	testgate.RequireUblk(t)
	ctx := context.Background()
	dir := mountXFS(t)
	seed := uint64(51)
	rng := rand.New(rand.NewPCG(seed, seed))
	const size = 64 * mib
	kind := "ublk"
	n := serveMetadata(t, newTestNodeWith(t, dir, "n1", kind))
	vol := n.create("pvc-diff", size, nil)
	pod := openPod(t, stageBlock(t, n, vol))
	// (deferred: before the nodes' cleanups close their backends)
	defer func() { pod.close(); unstageBlock(t, n, vol) }()
	id := storeVolumeID(vol)
	restart := func(next string) {
		t.Helper()
		kind = next
		n = serveMetadata(t, newTestNodeWith(t, dir, "n1", kind))
		if err := n.d.Reconcile(ctx); err != nil {
			t.Fatalf("reconcile on %s: %v", kind, err)
		}
	}
	// stop ends n as the plugin ends at SIGTERM (clean) or as it dies
	// (crash: the records it kept are lost). In the process, the ublk
	// server's threads end with Close, as they would with the process.
	stop := func(clean bool) {
		t.Helper()
		if clean {
			if err := n.d.HandOver(ctx); err != nil {
				t.Fatalf("hand over: %v", err)
			}
		}
		if err := n.backend.Close(); err != nil {
			t.Fatal(err)
		}
		state := filepath.Join(dir, "data", blockdev.UblkStateDir, id+".json")
		if _, err := os.Stat(state); !clean && err == nil {
			dropHandover(t, state)
		}
	}
	var snaps []string
	methods := map[store.DeltaMethod]int{}
	snapshot := func(round int) {
		t.Helper()
		s := n.snapshot(fmt.Sprintf("diff-%d", round), vol)
		if len(snaps) > 0 {
			what := fmt.Sprintf("round %d on %s (seed %d)", round, kind, seed)
			methods[checkNoMiss(t, n, snaps[len(snaps)-1], s, what)]++
			methods[checkNoMiss(t, n, snaps[0], s, what+", from the first")]++
		}
		snaps = append(snaps, s)
	}
	carried := false // on loop, staged before the restart onto ublk
	for round := range 14 {
		for range 1 + rng.IntN(12) {
			off := rng.Int64N(size/4096-64) * 4096
			switch rng.IntN(6) {
			case 0:
				pod.ioctlRange(unix.BLKDISCARD, off, 4096*(1+rng.Int64N(32)))
			case 1:
				pod.ioctlRange(unix.BLKZEROOUT, off, 4096*(1+rng.Int64N(32)))
			default:
				pod.write(off, 4096*(1+rng.IntN(64)), byte(rng.IntN(256)))
			}
		}
		event := rng.IntN(8)
		switch {
		case round == 0:
		case event == 0 && kind == "ublk":
			t.Logf("round %d: rollout", round)
			stop(true)
			restart("ublk")
		case event == 1 && kind == "ublk":
			t.Logf("round %d: crash", round)
			stop(false)
			restart("ublk")
		case event == 2 && kind == "ublk":
			t.Logf("round %d: moved to loop", round)
			pod.close()
			unstageBlock(t, n, vol)
			stop(true)
			restart("loop")
			pod = openPod(t, stageBlock(t, n, vol))
		case event == 2 && kind == "loop" && !carried:
			t.Logf("round %d: restart onto ublk, the volume still on loop", round)
			restart("ublk")
			carried = true
		case (event == 2 || event == 3) && carried:
			t.Logf("round %d: staged again, on ublk", round)
			pod.close()
			unstageBlock(t, n, vol)
			pod = openPod(t, stageBlock(t, n, vol))
			carried = false
		case event == 4 && kind == "ublk":
			t.Logf("round %d: a snapshot fails after its cut", round)
			name := fmt.Sprintf("failing-%d", round)
			blocker := filepath.Join(dir, "data", "changes", blockdev.SnapshotID(name)+".json")
			if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o700); err != nil {
				t.Fatal(err)
			}
			if _, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol}); err == nil {
				t.Fatalf("the snapshot %s did not fail", name)
			}
			if err := os.RemoveAll(blocker); err != nil {
				t.Fatal(err)
			}
		case event == 5 && kind == "ublk":
			t.Logf("round %d: stop during a snapshot", round)
			name := fmt.Sprintf("stopped-%d", round)
			done := make(chan error, 1)
			go func() {
				_, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
				done <- err
			}()
			stop(true)
			t.Logf("round %d: the snapshot during the stop: %v", round, <-done)
			restart("ublk")
		}
		snapshot(round)
	}
	t.Logf("seed %d: %d snapshots; deltas %v", seed, len(snaps), methods)
}
