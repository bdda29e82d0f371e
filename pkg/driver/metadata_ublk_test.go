package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TestUblkDeltaMatchesWrites writes known ranges through a raw block
// volume's ublk device between snapshots and checks the deltas: from the
// data path's records (never reading data) while the plugin runs, across
// an unstage and a restage and across a clean restart (the record handed
// over each time), and by comparing files after a restart whose
// re-adopted device lost the record, a write made before the restart
// included (hack/vm step 46 runs it).
func TestUblkDeltaMatchesWrites(t *testing.T) {
	testgate.RequireUblk(t)
	ctx := context.Background()
	dir := t.TempDir()
	n := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	vol := n.create("pvc-cbt", 64*mib, nil)
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	stage := func(n *metadataNode) {
		t.Helper()
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: blockCap(snw)}); err != nil {
			t.Fatalf("stage: %v", err)
		}
		if _, err := n.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: blockCap(snw)}); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	unstage := func(n *metadataNode) {
		t.Helper()
		if _, err := n.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
			t.Fatalf("unpublish: %v", err)
		}
		if _, err := n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage: %v", err)
		}
	}
	// write writes through the device, synced, so that the snapshot's
	// hold (which waits for completed writes only) finds it in the file.
	write := func(off int64, n int, seed byte) cbt.Extent {
		t.Helper()
		f, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(bytes.Repeat([]byte{seed}, n), off); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return cbt.Extent{Offset: off, Length: int64(n)}
	}
	check := func(n *metadataNode, base, target string, want store.DeltaMethod, written ...cbt.Extent) {
		t.Helper()
		_, _, how, err := n.d.store.Delta(ctx, storeVolumeIDOf(base), storeVolumeIDOf(target), true)
		if err != nil {
			t.Fatal(err)
		}
		if how != want {
			t.Errorf("delta found by %s, want %s", how, want)
		}
		r, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
		if err != nil {
			t.Fatal(err)
		}
		got := r.all()
		var chunks []cbt.Extent
		for _, w := range written {
			if cbt.Total(cbt.Clip(got, w.Offset, w.End())) != w.Length {
				t.Fatalf("delta %v misses the write %v", got, w)
			}
			start := w.Offset / cbt.Granularity * cbt.Granularity
			chunks = append(chunks, cbt.Extent{Offset: start, Length: (w.End()+cbt.Granularity-1)/cbt.Granularity*cbt.Granularity - start})
		}
		// The filesystem-free block device writes nothing else: the
		// delta is the written chunks, not more.
		if extra := cbt.Total(got) - cbt.Total(cbt.Union(chunks)); how == store.DeltaTracked && extra > 0 {
			t.Fatalf("delta %v reports %d bytes beyond the written chunks %v", got, extra, cbt.Union(chunks))
		}
	}

	stage(n)
	write(0, 4096, 1)
	s1 := n.snapshot("s1", vol)
	a := []cbt.Extent{write(mib, 4096, 2), write(mib+2048, 8192, 3), write(20*mib+512, 1024, 4), write(40*mib, 3*mib, 5)}
	s2 := n.snapshot("s2", vol)
	check(n, s1, s2, store.DeltaTracked, a...)

	// A clean unstage hands the record over; the next device carries it.
	b1 := write(50*mib, 4096, 6)
	unstage(n)
	stage(n)
	b2 := write(51*mib, 4096, 7)
	s3 := n.snapshot("s3", vol)
	check(n, s2, s3, store.DeltaTracked, b1, b2)
	check(n, s1, s3, store.DeltaTracked, append(a, b1, b2)...)

	// A write, then the plugin stops cleanly (its backend closes, the
	// device stays, quiesced) and hands the record over in the device's
	// state file: the next process's re-adopted device carries it on.
	c1 := write(30*mib, 4096, 8)
	if err := n.backend.Close(); err != nil {
		t.Fatal(err)
	}
	n2 := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	c2 := write(31*mib, 4096, 9)
	s4 := n2.snapshot("s4", vol)
	check(n2, s3, s4, store.DeltaTracked, c1, c2)

	// A write, then the plugin ends without a hand-over (a crash: here
	// its backend closes and the hand-over is taken out of the state
	// file, as if the process died first): the record of that write is
	// gone, so the delta compares files, and includes it.
	d1 := write(33*mib, 4096, 10)
	if err := n2.backend.Close(); err != nil {
		t.Fatal(err)
	}
	dropHandover(t, filepath.Join(dir, "data", "ublk", storeVolumeIDOf(vol)+".json"))
	n3 := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	d2 := write(34*mib, 4096, 11)
	s5 := n3.snapshot("s5", vol)
	check(n3, s4, s5, store.DeltaCompared, d1, d2)
	// From that snapshot on, the re-adopted device's record is trusted.
	e1 := write(35*mib, 4096, 12)
	s6 := n3.snapshot("s6", vol)
	check(n3, s5, s6, store.DeltaTracked, e1)
	unstage(n3)
}

// dropHandover removes the change record a clean stop left in a ublk
// device's state file.
func dropHandover(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Numbers as they are: the owner is a 64-bit nonce, which a float64
	// would round (and the device, no longer its owner's, would never be
	// re-adopted).
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var st map[string]any
	if err := dec.Decode(&st); err != nil {
		t.Fatal(err)
	}
	if _, ok := st["handover"]; !ok {
		t.Fatalf("no hand-over in %s after a clean stop", path)
	}
	delete(st, "handover")
	if data, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// storeVolumeIDOf is the store's ID in a CSI ID.
func storeVolumeIDOf(id string) string {
	storeID, _ := splitID(id)
	return storeID
}
