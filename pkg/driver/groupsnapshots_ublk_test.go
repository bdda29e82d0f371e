package driver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TestUblkGroupDeltasPerMember takes group snapshots of two raw block
// volumes served by ublk (each device's I/O held, both at once) with known
// writes through the devices before and between them, then a plain
// snapshot of one volume: every member's delta, to the next group's member
// and to the plain snapshot, comes from the data path's records (never
// read from the files) and covers exactly the chunks written to that
// volume (hack/vm step 48 runs it).
func TestUblkGroupDeltasPerMember(t *testing.T) {
	testgate.RequireUblk(t)
	ctx := context.Background()
	dir := t.TempDir()
	n := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	g := &GroupController{d: n.d}
	vols := []string{n.create("pvc-data", 64*mib, nil), n.create("pvc-log", 64*mib, nil)}
	targets := map[string]string{}
	for _, v := range vols {
		staging, target := filepath.Join(dir, "staging-"+v), filepath.Join(dir, "target-"+v)
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v, StagingTargetPath: staging, VolumeCapability: blockCap(snw)}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: blockCap(snw)}); err != nil {
			t.Fatal(err)
		}
		targets[v] = target
		t.Cleanup(func() {
			n.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v, TargetPath: target})
			n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v, StagingTargetPath: staging})
		})
	}
	write := func(v string, off int64, size int, seed byte) cbt.Extent {
		t.Helper()
		f, err := os.OpenFile(targets[v], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(bytes.Repeat([]byte{seed}, size), off); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return cbt.Extent{Offset: off, Length: int64(size)}
	}
	group := func(name string) map[string]string {
		t.Helper()
		resp, err := g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: vols})
		if err != nil {
			t.Fatal(err)
		}
		members := map[string]string{}
		for _, s := range resp.GetGroupSnapshot().GetSnapshots() {
			members[s.GetSourceVolumeId()] = s.GetSnapshotId()
		}
		return members
	}
	check := func(base, target string, written ...cbt.Extent) {
		t.Helper()
		_, _, how, err := n.d.store.Delta(ctx, storeVolumeIDOf(base), storeVolumeIDOf(target), true)
		if err != nil || how != store.DeltaTracked {
			t.Fatalf("delta %s..%s found by %v (%v), want the records", base, target, how, err)
		}
		r, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
		if err != nil {
			t.Fatal(err)
		}
		var chunks []cbt.Extent
		for _, w := range written {
			start := w.Offset / cbt.Granularity * cbt.Granularity
			chunks = append(chunks, cbt.Extent{Offset: start, Length: (w.End()+cbt.Granularity-1)/cbt.Granularity*cbt.Granularity - start})
		}
		if got, want := cbt.Union(r.all()), cbt.Union(chunks); !slices.Equal(got, want) {
			t.Fatalf("delta %s..%s = %v, want the written chunks %v", base, target, got, want)
		}
	}

	data, log := vols[0], vols[1]
	write(data, 0, 4096, 1)
	write(log, 0, 4096, 2)
	g1 := group("g1")
	d1, l1 := write(data, 2*mib, 8192, 3), write(log, 5*mib, 4096, 4)
	l2 := write(log, 9*mib+512, 1024, 5)
	g2 := group("g2")
	check(g1[data], g2[data], d1)
	check(g1[log], g2[log], l1, l2)
	d2 := write(data, 30*mib, 3*mib, 6)
	plain := n.snapshot("plain", data)
	check(g2[data], plain, d2)
	check(g1[data], plain, d1, d2)
}
