package driver

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func wantCode(t *testing.T, what string, err error, code codes.Code, contains ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s = %v, want %v", what, err, code)
	}
	for _, s := range contains {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Errorf("%s: message %q does not name %q", what, status.Convert(err).Message(), s)
		}
	}
}

// TestGroupSnapshotOfMountedVolumes snapshots two mounted volumes of one
// node as a group and follows the group through the CSI calls: members
// that restore the files written before it, a repeated create answered
// with the same group, the name refused for other volumes, members that
// name their group and are refused a delete of their own, Get, and a
// delete that checks the members it is told and removes them.
func TestGroupSnapshotOfMountedVolumes(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNode(t, t.TempDir())
	g := &GroupController{d: n.d}
	data, log := n.create("pvc-data", 64*mib, nil), n.create("pvc-log", 64*mib, nil)
	for _, id := range []string{data, log} {
		target := n.stage(id, mountCap("ext4", snw), false)
		if err := os.WriteFile(filepath.Join(target, "f"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	req := &csi.CreateVolumeGroupSnapshotRequest{Name: "groupsnapshot-1", SourceVolumeIds: []string{log, data}}
	resp, err := g.CreateVolumeGroupSnapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	grp := resp.GetGroupSnapshot()
	if !strings.HasSuffix(grp.GetGroupSnapshotId(), "-n1") || !grp.GetReadyToUse() || len(grp.GetSnapshots()) != 2 {
		t.Fatalf("group %v: want an ID of node n1, ready, two members", grp)
	}
	var sources []string
	for _, snap := range grp.GetSnapshots() {
		sources = append(sources, snap.GetSourceVolumeId())
		if snap.GetGroupSnapshotId() != grp.GetGroupSnapshotId() || !snap.GetReadyToUse() || !snap.GetCreationTime().AsTime().Equal(grp.GetCreationTime().AsTime()) {
			t.Errorf("member %v does not name its group %s or is not of its time", snap, grp.GetGroupSnapshotId())
		}
		restored := n.create("restored-"+snap.GetSourceVolumeId(), 0, snapshotSource(snap.GetSnapshotId()))
		got, err := os.ReadFile(filepath.Join(n.stage(restored, mountCap("ext4", snw), false), "f"))
		if err != nil || string(got) != snap.GetSourceVolumeId() {
			t.Errorf("restore of %s: %q, %v; want the file written before the group", snap.GetSnapshotId(), got, err)
		}
	}
	if slices.Sort(sources); !slices.Equal(sources, slices.Sorted(slices.Values([]string{data, log}))) {
		t.Fatalf("members of %v, want one of each volume", sources)
	}
	again, err := g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: req.Name, SourceVolumeIds: []string{data, log}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != grp.GetGroupSnapshotId() ||
		!again.GetGroupSnapshot().GetCreationTime().AsTime().Equal(grp.GetCreationTime().AsTime()) {
		t.Fatalf("repeat = %v, %v; want the same group", again, err)
	}
	_, err = g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: req.Name, SourceVolumeIds: []string{data}})
	wantCode(t, "the name with other volumes", err, codes.AlreadyExists)

	member := grp.GetSnapshots()[0].GetSnapshotId()
	got, err := n.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: member})
	if err != nil || got.GetSnapshot().GetGroupSnapshotId() != grp.GetGroupSnapshotId() {
		t.Fatalf("GetSnapshot of a member = %v, %v; want it to name its group", got, err)
	}
	_, err = n.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: member})
	wantCode(t, "DeleteSnapshot of a member", err, codes.InvalidArgument, grp.GetGroupSnapshotId())

	ids := []string{grp.GetSnapshots()[1].GetSnapshotId(), member}
	get, err := g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId(), SnapshotIds: ids})
	if err != nil || len(get.GetGroupSnapshot().GetSnapshots()) != 2 || !get.GetGroupSnapshot().GetReadyToUse() {
		t.Fatalf("GetVolumeGroupSnapshot = %v, %v", get, err)
	}
	_, err = g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId(), SnapshotIds: ids[:1]})
	wantCode(t, "DeleteVolumeGroupSnapshot naming one member", err, codes.InvalidArgument)
	if _, err := g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId(), SnapshotIds: ids}); err != nil {
		t.Fatal(err)
	}
	_, err = g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId()})
	wantCode(t, "Get after the delete", err, codes.NotFound)
	for _, id := range ids {
		_, err := n.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: id})
		wantCode(t, "GetSnapshot of a deleted member", err, codes.NotFound)
	}
	if _, err := g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId()}); err != nil {
		t.Errorf("second delete: %v, want OK", err)
	}
}

// TestGroupSnapshotRefusesOtherNodesVolumes: volumes of several nodes are
// FailedPrecondition naming each node and its volumes; volumes all of
// another node are FailedPrecondition naming that node; nothing is made.
// Bad requests are InvalidArgument.
func TestGroupSnapshotRefusesOtherNodesVolumes(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNode(t, t.TempDir())
	g := &GroupController{d: n.d}
	local := n.create("pvc-local", mib, nil)
	n2a, n2b, n3 := blockdev.VolumeID("a")+"-n2", blockdev.VolumeID("b")+"-n2", blockdev.VolumeID("c")+"-worker-3"
	_, err := g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "mixed", SourceVolumeIds: []string{local, n2a, n3, n2b}})
	wantCode(t, "a group of three nodes", err, codes.FailedPrecondition, "3 nodes", "node n1: "+local, "node n2: "+n2a+", "+n2b, "node worker-3: "+n3)
	_, err = g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "theirs", SourceVolumeIds: []string{n2a, n2b}})
	wantCode(t, "a group of node n2", err, codes.FailedPrecondition, "node n2", "not on node n1")
	for label, req := range map[string]*csi.CreateVolumeGroupSnapshotRequest{
		"no name":    {SourceVolumeIds: []string{local}},
		"no volumes": {Name: "g"},
		"parameters": {Name: "g", SourceVolumeIds: []string{local}, Parameters: map[string]string{"x": "y"}},
		"twice":      {Name: "g", SourceVolumeIds: []string{local, local}},
	} {
		_, err := g.CreateVolumeGroupSnapshot(ctx, req)
		wantCode(t, label, err, codes.InvalidArgument)
	}
	_, err = g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{blockdev.VolumeID("gone") + "-n1"}})
	wantCode(t, "a missing volume", err, codes.NotFound)
	if snaps := n.d.store.Snapshots(); len(snaps) != 0 {
		t.Errorf("refused groups left snapshots: %v", snaps)
	}
	_, err = g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: blockdev.GroupSnapshotID("x") + "-n2"})
	wantCode(t, "a delete of another node's group", err, codes.FailedPrecondition, "node n2")
	_, err = g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: blockdev.GroupSnapshotID("x") + "-n2"})
	wantCode(t, "a get of another node's group", err, codes.NotFound)
}

// TestIdentityAdvertisesGroupController: the plugin offers the
// GroupController service with its one capability.
func TestIdentityAdvertisesGroupController(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	caps, err := (&Identity{d: n.d}).GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(caps.GetCapabilities(), func(c *csi.PluginCapability) bool {
		return c.GetService().GetType() == csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE
	}) {
		t.Errorf("capabilities %v lack GROUP_CONTROLLER_SERVICE", caps)
	}
	gc, err := (&GroupController{d: n.d}).GroupControllerGetCapabilities(context.Background(), &csi.GroupControllerGetCapabilitiesRequest{})
	if err != nil || len(gc.GetCapabilities()) != 1 ||
		gc.GetCapabilities()[0].GetRpc().GetType() != csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT {
		t.Errorf("group capabilities = %v, %v", gc, err)
	}
}
