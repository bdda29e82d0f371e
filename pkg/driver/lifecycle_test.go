package driver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// These tests drive the services directly on the loop backend: real loop
// devices, real mkfs, real mounts. They need root.

type testNode struct {
	t       testing.TB
	dir     string
	d       *Driver
	ctrl    *Controller
	node    *Node
	backend blockdev.Backend
}

func requireRoot(t testing.TB) {
	t.Helper()
	testgate.RequireRoot(t)
}

func newTestNode(t *testing.T, dir string) *testNode {
	t.Helper()
	return newTestNodeOn(t, dir, "n1")
}

// newTestNodeOn is newTestNode for the node nodeID.
func newTestNodeOn(t testing.TB, dir, nodeID string) *testNode {
	t.Helper()
	return newTestNodeWith(t, dir, nodeID, "loop")
}

// newTestNodeWith is newTestNodeOn with the backend kind ("loop", "ublk").
func newTestNodeWith(t testing.TB, dir, nodeID, kind string) *testNode {
	t.Helper()
	store, err := store.Open(store.Config{Dir: filepath.Join(dir, "data"), OverProvisionRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() }) // its lock file would keep a tmpfs data dir mounted
	cfg := backend.Config{DataDir: filepath.Join(dir, "data"), DevDir: filepath.Join(dir, "dev")}
	b, err := backend.New(kind, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the stages' cleanups, registered later
	var former []blockdev.Backend
	if kind != "loop" {
		// As serve does: volumes staged through loop devices before a
		// restart onto ublk keep them.
		lb, err := backend.New("loop", cfg)
		if err != nil {
			t.Fatal(err)
		}
		former = append(former, lb)
	}
	d, err := New(Config{Name: "fastblk.csi.io", NodeID: nodeID, ControllerExpansion: true, FormerBackends: former}, store, b)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{t: t, dir: dir, d: d, ctrl: &Controller{d: d}, node: &Node{d: d}, backend: b}
}

func mountCap(fs string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

const snw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func (n *testNode) create(name string, size int64, src *csi.VolumeContentSource) string {
	n.t.Helper()
	resp, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, VolumeContentSource: src,
	})
	if err != nil {
		n.t.Fatalf("create %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

// stage stages and publishes a volume, returning the target path, and
// registers the undo with t.Cleanup.
func (n *testNode) stage(id string, c *csi.VolumeCapability, ro bool) string {
	n.t.Helper()
	ctx := context.Background()
	staging := filepath.Join(n.dir, "staging-"+id)
	target := filepath.Join(n.dir, "target-"+id)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		n.t.Fatal(err)
	}
	if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
		n.t.Fatalf("stage %s: %v", id, err)
	}
	if _, err := n.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: c, Readonly: ro}); err != nil {
		n.t.Fatalf("publish %s: %v", id, err)
	}
	n.t.Cleanup(func() { n.unstage(id) })
	return target
}

func (n *testNode) unstage(id string) {
	ctx := context.Background()
	v, err := n.d.store.Volume(storeVolumeID(id))
	if err != nil {
		return
	}
	for target := range v.Node.Targets {
		if _, err := n.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			n.t.Errorf("unpublish %s: %v", id, err)
		}
	}
	if v.Node.StagingPath != "" {
		if _, err := n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: v.Node.StagingPath}); err != nil {
			n.t.Errorf("unstage %s: %v", id, err)
		}
	}
}

// TestSnapshotOfMountedXFSRestores writes a file on a mounted XFS volume,
// snapshots and clones it while mounted (frozen for each copy), mounts the
// restored snapshot and the clone beside the original (nouuid) and reads
// the file back from both.
func TestSnapshotOfMountedXFSRestores(t *testing.T) {
	requireRoot(t)
	testgate.RequireTool(t, "mkfs.xfs")
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	src := n.create("xfs-src", 320<<20, nil)
	target := n.stage(src, mountCap("xfs", snw), false)
	want := bytes.Repeat([]byte("fastblk"), 10000)
	if err := os.WriteFile(filepath.Join(target, "data"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap1", SourceVolumeId: src})
	if err != nil {
		t.Fatalf("snapshot of mounted volume: %v", err)
	}
	restored := n.create("xfs-restored", 0, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
	clone := n.create("xfs-clone", 0, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}})
	for _, id := range []string{restored, clone} {
		target := n.stage(id, mountCap("xfs", snw), false)
		got, err := os.ReadFile(filepath.Join(target, "data"))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("volume %s: file has %d bytes, err %v; want the %d bytes written before the copy", id, len(got), err, len(want))
		}
	}
}

// TestOnlineExpansionGrowsFilesystem expands mounted ext4 and xfs volumes
// and checks each filesystem grew while its data stayed.
func TestOnlineExpansionGrowsFilesystem(t *testing.T) {
	requireRoot(t)
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			if fs == "ext4" && !haveCapability(t, 24) {
				testgate.Skip(t, testgate.CapResource, "online ext4 resize needs CAP_SYS_RESOURCE, which this sandbox withholds")
			}
			testgate.RequireTool(t, "mkfs."+fs)
			t.Run("controller and node", func(t *testing.T) { testOnlineExpansion(t, fs, true) })
			t.Run("node only", func(t *testing.T) { testOnlineExpansion(t, fs, false) })
		})
	}
}

// testOnlineExpansion grows a mounted volume; with controller false only
// NodeExpandVolume is called, as kubelet does when the driver does not
// advertise ControllerExpandVolume.
func testOnlineExpansion(t *testing.T, fs string, controller bool) {
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	const size, newSize = 320 << 20, 960 << 20
	id := n.create("grow-"+fs, size, nil)
	target := n.stage(id, mountCap(fs, snw), false)
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := fsstat.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if controller {
		if _, err := n.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := n.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCapacityBytes() != newSize {
		t.Errorf("capacity = %d, want %d", resp.GetCapacityBytes(), newSize)
	}
	after, err := fsstat.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if after.TotalBytes < 2*before.TotalBytes {
		t.Errorf("filesystem %d → %d bytes; want it to grow about 3×", before.TotalBytes, after.TotalBytes)
	}
	if b, err := os.ReadFile(filepath.Join(target, "keep")); err != nil || string(b) != "still here" {
		t.Errorf("data after expansion: %q, %v", b, err)
	}
}

// haveCapability reports whether this process has capability bit in its
// effective set.
func haveCapability(t *testing.T, bit uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<bit) != 0
		}
	}
	return false
}

// TestReadOnlyBlockPublishRefusesWrites publishes a raw block volume
// read-only and checks the kernel refuses to open it for writing.
func TestReadOnlyBlockPublishRefusesWrites(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	id := n.create("ro-block", 16<<20, nil)
	target := n.stage(id, blockCap(snw), true)
	if f, err := os.OpenFile(target, os.O_WRONLY, 0); err == nil {
		_, werr := f.WriteAt(make([]byte, 4096), 0)
		f.Close()
		if werr == nil {
			t.Fatal("wrote to a read-only block publication")
		}
	}
	f, err := os.Open(target)
	if err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Errorf("read: %v", err)
	}
	f.Close()
}

// TestSingleWriterRefusesSecondTarget enforces SINGLE_NODE_SINGLE_WRITER.
func TestSingleWriterRefusesSecondTarget(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	id := n.create("snsw", 16<<20, nil)
	c := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	n.stage(id, c, false)
	v, _ := n.d.store.Volume(storeVolumeID(id))
	_, err := n.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id,
		StagingTargetPath: v.Node.StagingPath, TargetPath: filepath.Join(n.dir, "second"), VolumeCapability: c})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second publish: %v, want FailedPrecondition", err)
	}
}

// TestRestartKeepsStagedVolumes stops using one driver and starts another
// on the same data directory: the staged volume's device and mount survive,
// Reconcile adopts the device, and unstaging through the new driver leaves
// nothing attached.
func TestRestartKeepsStagedVolumes(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	first := newTestNode(t, dir)
	id := first.create("survivor", 32<<20, nil)
	target := first.stage(id, mountCap("ext4", snw), false)
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	first.backend.Close()

	second := newTestNode(t, dir)
	if err := second.d.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(target, "f")); err != nil {
		t.Fatalf("mount lost across restart: %v", err)
	}
	second.unstage(id)
	devs, err := second.backend.List(context.Background())
	if err != nil || len(devs) != 0 {
		t.Fatalf("devices after unstage: %v, %v", devs, err)
	}
}

// TestLoopNodeRefusesRateLimits proves a node whose backend cannot enforce
// rate limits says so: a volume asking for limits is refused at creation
// (not at stage, after the PVC bound), and a modify that sets limits fails
// with InvalidArgument naming the backend, without changing the record.
// MODIFY_VOLUME is advertised all the same: without it the external-resizer
// ignores a VolumeAttributesClass change, silently (issue 22).
func TestLoopNodeRefusesRateLimits(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	caps, err := n.ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	modify := false
	for _, c := range caps.GetCapabilities() {
		modify = modify || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME
	}
	if !modify {
		t.Error("the loop backend does not advertise MODIFY_VOLUME: the external-resizer would ignore VolumeAttributesClass changes without a word")
	}
	req := &csi.CreateVolumeRequest{Name: "limited", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		Parameters:         map[string]string{ParamMaxIOPS: "100"}}
	_, err = n.ctrl.CreateVolume(ctx, req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ublk") {
		t.Fatalf("CreateVolume with maxIOPS on loop = %v, want InvalidArgument naming the ublk backend", err)
	}
	id := n.create("plain", 1<<20, nil)
	_, err = n.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: map[string]string{ParamMaxBandwidth: "10Mi"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "loop") || !strings.Contains(err.Error(), "ublk") {
		t.Fatalf("ControllerModifyVolume setting a limit on loop = %v, want InvalidArgument naming the loop and ublk backends", err)
	}
	if v, _ := n.d.store.Volume(storeVolumeID(id)); len(v.MutableParams) != 0 {
		t.Fatalf("a refused modify changed the record: %v", v.MutableParams)
	}
	if _, err := n.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: map[string]string{ParamMaxIOPS: "0"}}); err != nil {
		t.Fatalf("ControllerModifyVolume with no limit on loop: %v", err)
	}
}

// TestRestoreIntoLargerVolumeGrowsFilesystem restores a snapshot and clones
// a volume into claims twice the source's size: the staged filesystem must
// fill the larger device (Kubernetes' "provision correct filesystem size
// when restoring snapshot to larger size pvc"), not keep the source's size.
// ext4 grows before it is mounted: growing it mounted needs
// CAP_SYS_RESOURCE, which this machine withholds; xfs grows mounted.
func TestRestoreIntoLargerVolumeGrowsFilesystem(t *testing.T) {
	requireRoot(t)
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			testgate.RequireTool(t, "mkfs."+fs)
			testRestoreIntoLarger(t, fs)
		})
	}
}

func testRestoreIntoLarger(t *testing.T, fs string) {
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	src := n.create("small-src", 320<<20, nil)
	target := n.stage(src, mountCap(fs, snw), false)
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "small-snap", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{
		n.create("large-restore", 640<<20, snapshotSource(snap.GetSnapshot().GetSnapshotId())),
		n.create("large-clone", 640<<20, volumeSource(src)),
	} {
		target := n.stage(id, mountCap(fs, snw), false)
		var st syscall.Statfs_t
		if err := syscall.Statfs(target, &st); err != nil {
			t.Fatal(err)
		}
		if size := int64(st.Blocks) * st.Bsize; size < 560<<20 {
			t.Errorf("volume %s of 640 MiB restored from 320 MiB: filesystem of %d MiB", id, size>>20)
		}
		if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "kept" {
			t.Errorf("volume %s: data %q, %v", id, got, err)
		}
	}
}

// TestRestageAfterControllerExpansionGrowsExt4 follows the kubelet through
// Kubernetes' "resize volume when PVC is edited and the pod is re-created
// on the same node after controller resize is finished": the volume is
// unstaged, ControllerExpandVolume grows its file, and the new pod's stage
// must find the filesystem at the new size before NodeExpandVolume is
// called on the mounted volume, whose ext4 this machine cannot grow
// (growing a mounted ext4 needs CAP_SYS_RESOURCE).
func TestRestageAfterControllerExpansionGrowsExt4(t *testing.T) {
	requireRoot(t)
	testgate.RequireTool(t, "mkfs.ext4")
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	const size, newSize = 64 << 20, 192 << 20
	id := n.create("regrow", size, nil)
	target := n.stage(id, mountCap("ext4", snw), false)
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := fsstat.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	n.unstage(id)
	if _, err := n.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}}); err != nil {
		t.Fatal(err)
	}
	target = n.stage(id, mountCap("ext4", snw), false)
	staged, err := fsstat.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if staged.TotalBytes < 2*before.TotalBytes {
		t.Errorf("staged after growing to %d bytes: filesystem %d → %d bytes; want it about 3× larger",
			int64(newSize), before.TotalBytes, staged.TotalBytes)
	}
	resp, err := n.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}})
	if err != nil {
		t.Fatalf("NodeExpandVolume after the stage: %v", err)
	}
	if resp.GetCapacityBytes() != newSize {
		t.Errorf("capacity = %d, want %d", resp.GetCapacityBytes(), newSize)
	}
	if b, err := os.ReadFile(filepath.Join(target, "keep")); err != nil || string(b) != "still here" {
		t.Errorf("data after the regrowth: %q, %v", b, err)
	}
}
