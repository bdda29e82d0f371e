package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// TestObjectsOfAnotherNode runs two nodes' plugins, each on its own data
// directory, and sends n2 requests for n1's volume and snapshot, as
// Kubernetes does: a restore or clone whose pod the scheduler put on n2
// gets ResourceExhausted (the external-provisioner then sends the claim
// back to the scheduler) with a message naming both nodes, not NotFound;
// what exists on no node stays NotFound; without the peer channel, a
// modify or controller expansion from the external-resizer's leader on n2
// fails with FailedPrecondition saying so (peer_test.go: with it, n1
// answers), and a delete there leaves n1's volume alone.
func TestObjectsOfAnotherNode(t *testing.T) {
	requireRoot(t)
	n1 := newTestNodeOn(t, t.TempDir(), "n1")
	n2 := newTestNodeOn(t, t.TempDir(), "n2")
	ctx := context.Background()
	vol := n1.create("pvc-source", 1<<20, nil)
	snap, err := n1.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-source", SourceVolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	if snap.GetSnapshot().GetSourceVolumeId() != vol {
		t.Fatalf("snapshot source %q, want the volume's ID %q", snap.GetSnapshot().GetSourceVolumeId(), vol)
	}

	create := func(name string, src *csi.VolumeContentSource) error {
		_, err := n2.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, VolumeContentSource: src})
		return err
	}
	wantCode := func(what string, err error, code codes.Code, words ...string) {
		t.Helper()
		if status.Code(err) != code {
			t.Errorf("%s on n2: %v, want %v", what, err, code)
			return
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s on n2: %q does not say %q", what, err, w)
			}
		}
	}
	wantCode("restore of n1's snapshot", create("pvc-restore", snapshotSource(snapID)), codes.ResourceExhausted,
		snapID, "lives on node n1, not on node n2", "nodeSelector "+TopologyKey+": n1")
	wantCode("clone of n1's volume", create("pvc-clone", volumeSource(vol)), codes.ResourceExhausted, vol, "lives on node n1, not on node n2")
	// What exists on no node: tagged for n2, untagged, or not ours at all.
	missing := []string{n2.d.publicID(blockdev.SnapshotID("gone")), blockdev.SnapshotID("gone"), "no-such-snapshot"}
	for _, id := range missing {
		wantCode("restore of missing snapshot "+id, create("pvc-missing", snapshotSource(id)), codes.NotFound)
	}
	wantCode("clone of a missing volume", create("pvc-missing", volumeSource(n2.d.publicID(blockdev.VolumeID("gone")))), codes.NotFound)

	_, err = n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: map[string]string{ParamMaxIOPS: "0"}})
	wantCode("ControllerModifyVolume of n1's volume", err, codes.FailedPrecondition, vol, "peer channel is off", "n2")
	_, err = n2.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	wantCode("ControllerExpandVolume of n1's volume", err, codes.FailedPrecondition, vol, "peer channel is off", "n2")
	_, err = n2.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol})
	wantCode("DeleteVolume of n1's volume", err, codes.FailedPrecondition, vol)
	_, err = n2.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
	wantCode("DeleteSnapshot of n1's snapshot", err, codes.FailedPrecondition, snapID)
	_, err = n2.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snapID})
	wantCode("GetSnapshot of n1's snapshot", err, codes.NotFound, "lives on node n1")
	if l, err := n2.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID}); err != nil || len(l.GetEntries()) != 0 {
		t.Errorf("ListSnapshots of n1's snapshot on n2: %v, %v", l, err)
	}

	// n1 still has both and serves them.
	if _, err := n1.d.store.Volume(storeVolumeID(vol)); err != nil {
		t.Fatalf("n1's volume after n2's refusals: %v", err)
	}
	restored := n1.create("pvc-restore", 1<<20, snapshotSource(snapID))
	clone := n1.create("pvc-clone", 1<<20, volumeSource(vol))
	for _, id := range []string{restored, clone} {
		if _, tag := splitID(id); tag != n1.d.tag {
			t.Errorf("volume %s has tag %q, want n1's %q", id, tag, n1.d.tag)
		}
	}
	got, err := n1.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snapID})
	if err != nil || got.GetSnapshot().GetSnapshotId() != snapID {
		t.Fatalf("GetSnapshot on n1: %v, %v", got, err)
	}
	// IDs made before tags are served as they are.
	legacy := storeVolumeID(vol)
	if _, err := n1.ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: legacy}); err != nil {
		t.Errorf("ControllerGetVolume of the untagged ID %s on n1: %v", legacy, err)
	}
}

func snapshotSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

// TestNodeTags: node IDs that fit are the tag itself, longer ones a hash,
// and every tagged ID stays within the CSI limit and splits back.
func TestNodeTags(t *testing.T) {
	for _, node := range []string{"n1", "worker-3.example.com", strings.Repeat("a", maxNodeInID), strings.Repeat("b", maxNodeInID+1), strings.Repeat("c", 253)} {
		d := &Driver{cfg: Config{NodeID: node}, tag: nodeTag(node), store: &classes{}}
		for _, storeID := range []string{blockdev.VolumeID("pvc-1"), blockdev.SnapshotID("snap-1")} {
			id := d.publicID(storeID)
			if len(id) > maxIDLen {
				t.Errorf("node %.20s…: ID %d bytes long", node, len(id))
			}
			gotID, gotTag := splitID(id)
			if gotID != storeID || gotTag != d.tag {
				t.Errorf("splitID(%q) = %q, %q; want %q, %q", id, gotID, gotTag, storeID, d.tag)
			}
			if local, err := d.localID(id, "volume", codes.NotFound); err != nil || local != storeID {
				t.Errorf("localID(%q) on its own node = %q, %v", id, local, err)
			}
		}
		if long := len(node) > maxNodeInID; long != strings.HasPrefix(d.tag, "#") || (!long && d.tag != node) {
			t.Errorf("node of %d bytes has tag %q", len(node), d.tag)
		}
	}
	for _, id := range []string{"", "v1", blockdev.VolumeID("x"), blockdev.VolumeID("x") + "-", "no-such-volume-n1"} {
		if storeID, tag := splitID(id); storeID != id || tag != "" {
			t.Errorf("splitID(%q) = %q, %q; want it untagged", id, storeID, tag)
		}
	}
}

// TestHoldsSnapshot: a node holds the snapshots tagged with it and the
// untagged ones in its store; not another node's, nor a volume's ID, nor
// an untagged snapshot it does not have (what snapshotowner labels by).
func TestHoldsSnapshot(t *testing.T) {
	requireRoot(t)
	n1 := newTestNodeOn(t, t.TempDir(), "n1")
	n2 := newTestNodeOn(t, t.TempDir(), "n2")
	vol := n1.create("pvc-source", 1<<20, nil)
	snap, err := n1.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: "snap-source", SourceVolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	id := snap.GetSnapshot().GetSnapshotId()
	storeID, _ := splitID(id)
	for _, c := range []struct {
		node *testNode
		id   string
		want bool
	}{
		{n1, id, true}, {n2, id, false},
		{n1, storeID, true}, {n2, storeID, false}, // untagged: by the store
		{n1, vol, false}, {n1, blockdev.SnapshotID("gone"), false}, {n1, "", false},
	} {
		if got := c.node.d.HoldsSnapshot(c.id); got != c.want {
			t.Errorf("%s.HoldsSnapshot(%q) = %v, want %v", c.node.d.cfg.NodeID, c.id, got, c.want)
		}
	}
}
