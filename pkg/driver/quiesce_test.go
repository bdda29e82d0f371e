package driver

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
)

// mountXFS mounts a fresh reflink XFS on a new directory (a data directory
// that shares extents) and unmounts it in t.Cleanup.
func mountXFS(t *testing.T) string {
	t.Helper()
	testgate.RequireTool(t, "mkfs.xfs")
	img := filepath.Join(t.TempDir(), "xfs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 1<<30); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-f", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

func volumeSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// TestRawBlockCopyInUse proves what a snapshot or clone of a raw block
// volume in use on the loop backend (which cannot hold a device's I/O)
// gets: on a data directory that reflinks, the device is flushed first, so
// a write the pod made and did not sync is in the copy, and the reflink is
// a single point in time; on one that cannot reflink, the copy would not be
// crash-consistent and is refused with FailedPrecondition, naming why.
func TestRawBlockCopyInUse(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	t.Run("reflink", func(t *testing.T) {
		n := newTestNode(t, mountXFS(t))
		id := n.create("raw", 64<<20, nil)
		target := n.stage(id, blockCap(snw), false)
		dev, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close() // the last close would sync; keep it open
		want := bytes.Repeat([]byte("unsynced pod write\n"), 1<<14)
		if _, err := dev.WriteAt(want, 8<<20); err != nil {
			t.Fatal(err)
		}
		snap, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "raw-snap", SourceVolumeId: id})
		if err != nil {
			t.Fatalf("snapshot of a raw block volume in use: %v", err)
		}
		clone := n.create("raw-clone", 64<<20, volumeSource(id))
		for _, file := range []string{
			filepath.Join(n.dir, "data", "snapshots", storeVolumeID(snap.GetSnapshot().GetSnapshotId())+".img"),
			n.d.store.VolumeFile(storeVolumeID(clone)),
		} {
			got := make([]byte, len(want))
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.ReadAt(got, 8<<20)
			f.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s lacks the write the device held in its cache (%v): the device was not flushed", file, err)
			}
		}
	})
	t.Run("copy", func(t *testing.T) {
		n := newTestNode(t, t.TempDir()) // ext4: no reflink
		id := n.create("raw", 64<<20, nil)
		early := &csi.CreateSnapshotRequest{Name: "taken-unused", SourceVolumeId: id}
		if _, err := n.ctrl.CreateSnapshot(ctx, early); err != nil {
			t.Fatal(err)
		}
		n.stage(id, blockCap(snw), false)
		if _, err := n.ctrl.CreateSnapshot(ctx, early); err != nil {
			t.Errorf("repeated CreateSnapshot of a snapshot taken before the volume was used = %v, want it returned", err)
		}
		_, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "raw-snap", SourceVolumeId: id})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("snapshot of a raw block volume in use without reflink = %v, want FailedPrecondition", err)
		}
		_, err = n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "raw-clone",
			VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}, VolumeContentSource: volumeSource(id)})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("clone of a raw block volume in use without reflink = %v, want FailedPrecondition", err)
		}
		if snaps := n.d.store.Snapshots(); len(snaps) != 1 {
			t.Errorf("refused snapshot left %v", snaps)
		}
	})
}

// quiescingBackend is the loop backend with an IOHolder, as the ublk backend
// has: it records each hold and its release (and flushes the device,
// which is all a loop device allows).
type quiescingBackend struct {
	blockdev.Backend
	dev             string
	holds, releases int
}

func (b *quiescingBackend) HoldIO(ctx context.Context, id string) (func() error, error) {
	b.holds++
	if err := quiesce.FlushDevice(ctx, b.dev); err != nil {
		return nil, err
	}
	return func() error { b.releases++; return nil }, nil
}

// TestRawBlockUsesBackendIOHolder proves that a raw block volume in use is
// held through the backend's IOHolder when it has one, once per copy and
// released after it, and that such a backend needs no reflink.
func TestRawBlockUsesBackendIOHolder(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir()) // ext4: no reflink
	qb := &quiescingBackend{Backend: n.backend}
	d, err := New(n.d.cfg, n.d.store.def, qb)
	if err != nil {
		t.Fatal(err)
	}
	n.d, n.ctrl, n.node = d, &Controller{d: d}, &Node{d: d}
	id := n.create("raw", 64<<20, nil)
	n.stage(id, blockCap(snw), false)
	v, err := n.d.store.Volume(storeVolumeID(id))
	if err != nil {
		t.Fatal(err)
	}
	qb.dev = v.Node.Device
	ctx := context.Background()
	if _, err := n.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "held", SourceVolumeId: id}); err != nil {
		t.Fatalf("snapshot of a raw block volume in use with an IOHolder: %v", err)
	}
	n.create("held-clone", 64<<20, volumeSource(id))
	if qb.holds != 2 || qb.releases != 2 {
		t.Errorf("HoldIO called %d times and released %d for a snapshot and a clone, want 2 and 2", qb.holds, qb.releases)
	}
}
