package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestFullDiskAfterSnapshot is TestFullDisk's reflink case, on a data
// directory on xfs with reflink: a snapshot shares the volume's blocks, so
// overwriting them needs new blocks (copy on write) although the volume is
// fully allocated. With the filesystem full, such an overwrite must fail
// with ENOSPC at once (no hang, not EIO); reads, and another volume's
// overwrites, go on; the log and the metrics say the data directory is
// full and /healthz stays ok (a restart frees nothing). Once space is
// freed the overwrite goes through, the snapshot still holds what it was
// taken of (restored over CSI and read), and the plugin starts again on
// the data directory with every record readable.
func TestFullDiskAfterSnapshot(t *testing.T) {
	testgate.RequireRoot(t)
	// The disk is not below dir, which undoLeftovers clears of mounts.
	dir, disk := t.TempDir(), filepath.Join(t.TempDir(), "disk")
	reflinkFS(t, disk, 320<<20)
	data := filepath.Join(disk, "data")
	bin := buildBinary(t)
	p := launchOn(t, bin, dir, data)
	t.Cleanup(func() { p.undoLeftovers(t) }) // a failed run leaves volumes published
	ctx := context.Background()
	const mib = 1 << 20
	const size = 32 * mib
	id, staging, target := p.provisionAt(t, "cow", size, capBlock, filepath.Join(dir, "staging-cow"), "cow", nil)
	other, otherStaging, otherTarget := p.provisionAt(t, "other", 16*mib, capBlock, filepath.Join(dir, "staging-other"), "other", nil)
	mustIO(t, "write the whole volume", target, true, alignedBuf(t, size, 0xa1), 0, 0)
	mustIO(t, "write the other volume", otherTarget, true, alignedBuf(t, 4*mib, 0x5a), 0, 0)

	// The snapshot is a reflink (TestDedicatedDisk): it shares every
	// block of the volume and takes next to no space.
	before := freeBytes(t, data)
	snap, err := csi.NewControllerClient(p.conn).CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "cow-snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	if used := before - freeBytes(t, data); used > 4*mib {
		t.Fatalf("the snapshot of a %d MiB volume took %d bytes: a copy, not a reflink; nothing here would be shared", size/mib, used)
	}
	filler := filepath.Join(disk, "filler")
	n := fillUp(t, filler)
	t.Logf("the data directory's filesystem is full after %d MiB of filler (%d bytes free)", n/mib, freeBytes(t, data))

	// Overwriting blocks the snapshot shares needs new ones.
	const at = 8 * mib
	start := time.Now()
	err = directIO(t, target, true, alignedBuf(t, mib, 0xb2), at)
	if err == nil {
		t.Fatal("an overwrite of blocks a snapshot shares succeeded on a full disk")
	}
	t.Logf("overwrite of shared blocks on a full disk: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("the writer got %v, want ENOSPC", err)
	}
	// Reads need no space; the other volume's blocks are its own, so
	// overwriting them needs none either. (The failed range may hold
	// either content: a failed write promises nothing there.)
	mustIO(t, "read before the failed range", target, false, alignedBuf(t, at, 0), 0, 0xa1)
	mustIO(t, "read after the failed range", target, false, alignedBuf(t, size-at-mib, 0), at+mib, 0xa1)
	mustIO(t, "overwrite of the other volume on a full disk", otherTarget, true, alignedBuf(t, 4*mib, 0xc3), 0, 0)
	mustIO(t, "read back the other volume on a full disk", otherTarget, false, alignedBuf(t, 4*mib, 0), 0, 0xc3)

	// The operator sees it; restarting the plugin would not free space,
	// so /healthz stays ok.
	p.waitLog(t, "the data directory is full")
	_, body := p.get(t, "/metrics")
	if a := metric(t, body, "fastblk_node_capacity_available_bytes"); a != 0 {
		t.Errorf("fastblk_node_capacity_available_bytes = %v on a full disk, want 0", a)
	}
	if code, body := p.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz on a full disk = %d %q, want 200", code, body)
	}
	if testBackend() == "ublk" {
		errs := func(name, id string) float64 {
			return metric(t, body, fmt.Sprintf(`fastblk_volume_errors_total{device_class="default",name=%q,namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`,
				name, storeIDOf(id)))
		}
		if e := errs("cow", id); e < 1 {
			t.Errorf("fastblk_volume_errors_total of the volume = %v after a failed write, want ≥ 1", e)
		}
		if e := errs("other", other); e != 0 {
			t.Errorf("fastblk_volume_errors_total of the other volume = %v, want 0", e)
		}
		p.waitLog(t, "volume I/O failed", `volumeID="`+storeIDOf(id)+`"`)
	}

	// Space comes back: the same overwrite goes through, and the rest of
	// the volume is as it was.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustIO(t, "overwrite after space was freed", target, true, alignedBuf(t, mib, 0xb2), at, 0)
	mustIO(t, "read back the overwrite", target, false, alignedBuf(t, mib, 0), at, 0xb2)
	mustIO(t, "read back the rest", target, false, alignedBuf(t, at, 0), 0, 0xa1)
	p.waitLog(t, "the data directory has free space again")
	checkSnapshot(t, p, snap.GetSnapshot().GetSnapshotId(), size, 0xa1)

	// The plugin starts again on the data directory: no record is set
	// aside, every volume and the snapshot are listed, and the volume
	// holds what was written.
	p.unpublish(t, id, staging, target)
	p.unpublish(t, other, otherStaging, otherTarget)
	p.stop(t)
	p = launchOn(t, bin, dir, data)
	waitReady(t, p)
	_, body = p.get(t, "/metrics")
	if q := metric(t, body, "fastblk_quarantined_records"); q != 0 {
		t.Errorf("fastblk_quarantined_records = %v after a restart, want 0", q)
	}
	checkListed(t, p, []string{id, other}, []string{snap.GetSnapshot().GetSnapshotId()})
	target = p.publish(t, id, capBlock, staging, "cow")
	mustIO(t, "read the overwrite after a restart", target, false, alignedBuf(t, mib, 0), at, 0xb2)
	mustIO(t, "read the rest after a restart", target, false, alignedBuf(t, size-at-mib, 0), at+mib, 0xa1)
	p.release(t, id, staging, target)
	if _, err := csi.NewControllerClient(p.conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := csi.NewControllerClient(p.conn).DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{
		SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
}

// checkSnapshot restores snapshot snapID into a new raw block volume over
// CSI, reads all size bytes of it, which must be want, and deletes it.
func checkSnapshot(t *testing.T, p *runningPlugin, snapID string, size int64, want byte) {
	t.Helper()
	vol, err := csi.NewControllerClient(p.conn).CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "restored",
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{capBlock},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}})
	if err != nil {
		t.Fatalf("restore snapshot %s: %v", snapID, err)
	}
	id, staging := vol.GetVolume().GetVolumeId(), filepath.Join(p.dir, "staging-restored")
	target := p.publish(t, id, capBlock, staging, "restored")
	mustIO(t, "read the restored snapshot", target, false, alignedBuf(t, int(size), 0), 0, want)
	p.release(t, id, staging, target)
}

// checkListed fails unless ListVolumes and ListSnapshots name exactly
// volumes and snapshots.
func checkListed(t *testing.T, p *runningPlugin, volumes, snapshots []string) {
	t.Helper()
	ctx := context.Background()
	ctrl := csi.NewControllerClient(p.conn)
	vr, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var gotV []string
	for _, e := range vr.GetEntries() {
		gotV = append(gotV, e.GetVolume().GetVolumeId())
	}
	sr, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var gotS []string
	for _, e := range sr.GetEntries() {
		gotS = append(gotS, e.GetSnapshot().GetSnapshotId())
	}
	for _, l := range [][]string{volumes, snapshots, gotV, gotS} {
		slices.Sort(l)
	}
	if !slices.Equal(gotV, volumes) || !slices.Equal(gotS, snapshots) {
		t.Errorf("listed volumes %q and snapshots %q, want %q and %q", gotV, gotS, volumes, snapshots)
	}
}
