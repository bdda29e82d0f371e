package driver

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestForwardedMetadataMatchesLocal proves n2's CSI socket answers for n1's snapshot
// through the peer channel exactly as n1's own socket does.
func TestForwardedMetadataMatchesLocal(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodes(t, "loop")
	n1.d.cfg.PeerMetadata = true
	m1, m2 := serveMetadata(t, n1), serveMetadata(t, n2)
	vol := m1.create("v", 16*mib, nil)
	for i := range int64(8) {
		m1.write(vol, i*mib, "data")
	}
	base := m1.snapshot("base", vol)
	m1.write(vol, 2*mib, "changed")
	m1.write(vol, 10*mib+4096, "new")
	target := m1.snapshot("target", vol)
	for _, mr := range []int32{0, 3} {
		want, err := m1.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, MaxResults: mr})
		if err != nil {
			t.Fatal(err)
		}
		got, err := m2.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, MaxResults: mr})
		if err != nil || !slices.Equal(got.all(), want.all()) || len(got.pages) != len(want.pages) || got.capacity != want.capacity {
			t.Fatalf("allocated via n2 (max %d): %v %v, %v; want %v", mr, got.all(), got.capacity, err, want.all())
		}
		wd, err := m1.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, MaxResults: mr})
		if err != nil {
			t.Fatal(err)
		}
		gd, err := m2.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, MaxResults: mr})
		if err != nil || !slices.Equal(gd.all(), wd.all()) || len(gd.pages) != len(wd.pages) {
			t.Fatalf("delta via n2 (max %d): %v, %v; want %v", mr, gd.all(), err, wd.all())
		}
		t.Logf("max_results %d: allocated %v in %d pages, delta %v in %d pages, same through n2", mr, want.all(), len(want.pages), wd.all(), len(wd.pages))
	}
}
