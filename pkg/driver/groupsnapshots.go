package driver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// GroupController implements csi.GroupControllerServer: group snapshots
// of volumes of this node, every member held at one instant
// (store.CreateGroupSnapshot). Volumes of several nodes are refused: the
// plugins would have to hold each other's volumes across the network for
// one instant (docs/group-snapshots.md says why that is not done).
type GroupController struct {
	csi.UnimplementedGroupControllerServer
	d *Driver
}

func (g *GroupController) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

// CreateVolumeGroupSnapshot snapshots the source volumes at one instant:
// each is held as CreateSnapshot holds it (a frozen filesystem, the
// device's I/O held, or a flushed device copied by one reflink), all of
// them at once, while their change records are cut and their copies made
// exact. Idempotent by name; the same name with other volumes is
// AlreadyExists.
func (g *GroupController) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	name := req.GetName()
	switch {
	case name == "":
		return nil, invalid("group snapshot name is missing")
	case len(name) > maxNameLen:
		return nil, invalid("group snapshot name is longer than %d bytes", maxNameLen)
	case len(req.GetSourceVolumeIds()) == 0:
		return nil, invalid("group snapshot %q names no source volumes", name)
	case len(req.GetParameters()) > 0:
		return nil, invalid("group snapshots take no parameters")
	}
	ids, err := g.d.groupVolumes(name, req.GetSourceVolumeIds())
	if err != nil {
		return nil, err
	}
	gid := blockdev.GroupSnapshotID(name)
	unlock, err := g.d.lockGroup(ctx, gid, ids)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var grp blockdev.GroupSnapshot
	if have, err := g.d.store.GroupSnapshot(gid); err == nil {
		// A repeated call is answered without a copy.
		if !slices.Equal(memberVolumes(have), ids) {
			return nil, toStatus(fmt.Errorf("group snapshot %q exists of other volumes (%s): %w",
				name, strings.Join(memberVolumes(have), ", "), blockdev.ErrConflict))
		}
		grp = have
	} else if grp, err = g.d.takeGroup(ctx, name, ids); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: g.d.csiGroupSnapshot(grp)}, nil
}

// takeGroup makes the group snapshot name of the volumes ids (sorted, locked by
// the caller) and logs how long they were held.
func (d *Driver) takeGroup(ctx context.Context, name string, ids []string) (blockdev.GroupSnapshot, error) {
	var w groupWindow
	sources := make([]store.GroupSource, len(ids))
	for i, id := range ids {
		v, err := d.store.Volume(id)
		if err != nil {
			return blockdev.GroupSnapshot{}, toStatus(fmt.Errorf("group snapshot %q: source volume %s: %w", name, id, err))
		}
		hold, err := d.holdFor(v)
		if err != nil {
			return blockdev.GroupSnapshot{}, err
		}
		sources[i] = store.GroupSource{VolumeID: id, Hold: w.measure(hold), Cut: d.changeCut(id)}
	}
	grp, err := d.store.CreateGroupSnapshot(ctx, name, sources)
	if err != nil {
		return blockdev.GroupSnapshot{}, toStatus(err)
	}
	klog.InfoS("group snapshot created", "groupSnapshotID", grp.ID, "volumes", ids, "held", w.held, "holding", w.holding)
	return grp, nil
}

// groupWindow measures the instant a group snapshot holds its members
// at: holding is from the first member's hold to the last member held,
// held from the first member's hold to the last release. The store runs
// the holds and releases one at a time, so no lock is needed.
type groupWindow struct {
	start         time.Time
	holding, held time.Duration
}

// measure wraps a member's hold (nil stays nil) to count it in w.
func (w *groupWindow) measure(hold store.Hold) store.Hold {
	if hold == nil {
		return nil
	}
	return func(ctx context.Context) (func() error, error) {
		if w.start.IsZero() {
			w.start = time.Now()
		}
		release, err := hold(ctx)
		if err != nil {
			return nil, err
		}
		w.holding = time.Since(w.start)
		return func() error {
			err := release()
			w.held = time.Since(w.start)
			return err
		}, nil
	}
}

// groupVolumes maps a group's CSI volume IDs to this node's store IDs,
// sorted. Volumes of other nodes are FailedPrecondition naming each node
// and its volumes; a volume named twice is InvalidArgument.
func (d *Driver) groupVolumes(name string, csiIDs []string) ([]string, error) {
	byNode := map[string][]string{}
	ids := make([]string, 0, len(csiIDs))
	for _, id := range csiIDs {
		storeID, tag := splitID(id)
		if tag == "" {
			tag = d.tag
		}
		byNode[tag] = append(byNode[tag], id)
		ids = append(ids, storeID)
	}
	slices.Sort(ids)
	if len(slices.Compact(slices.Clone(ids))) != len(ids) {
		return nil, invalid("group snapshot %q names a volume more than once: %s", name, strings.Join(csiIDs, ", "))
	}
	if _, local := byNode[d.tag]; local && len(byNode) == 1 {
		return ids, nil
	}
	var where []string
	for _, tag := range slices.Sorted(maps.Keys(byNode)) {
		where = append(where, fmt.Sprintf("%s: %s", tagNode(tag), strings.Join(byNode[tag], ", ")))
	}
	if len(byNode) == 1 {
		return nil, precondition("group snapshot %q: its volumes live on %s, not on node %s: a group snapshot is taken by the plugin of its volumes' node",
			name, where[0], d.cfg.NodeID)
	}
	return nil, precondition("group snapshot %q: its volumes live on %d nodes (%s): a group snapshot holds volumes of one node "+
		"at one instant; run the pods that use them on one node, or snapshot each node's volumes apart",
		name, len(byNode), strings.Join(where, "; "))
}

// lockGroup locks the group gid's name, then its volumes in sorted order
// (so that two groups of shared volumes never wait on each other).
func (d *Driver) lockGroup(ctx context.Context, gid string, volumeIDs []string) (func(), error) {
	var unlocks []func()
	unlockAll := func() {
		for _, u := range slices.Backward(unlocks) {
			u()
		}
	}
	u, err := d.locks.lock(ctx, "group/"+gid)
	if err != nil {
		return nil, toStatus(fmt.Errorf("wait for group snapshot %s: %w", gid, err))
	}
	unlocks = append(unlocks, u)
	for _, id := range volumeIDs {
		u, err := d.lockVolume(ctx, id)
		if err != nil {
			unlockAll()
			return nil, err
		}
		unlocks = append(unlocks, u)
	}
	return unlockAll, nil
}

func memberVolumes(g blockdev.GroupSnapshot) []string {
	ids := make([]string, len(g.Members))
	for i, m := range g.Members {
		ids[i] = m.VolumeID
	}
	return ids
}

// csiGroupSnapshot describes a group snapshot. It is ready when all its
// members are; a member missing (a delete that stopped part way) makes it
// not ready, and is left out.
func (d *Driver) csiGroupSnapshot(g blockdev.GroupSnapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: d.publicID(g.ID), CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: true}
	for _, m := range g.Members {
		snap, err := d.store.Snapshot(m.SnapshotID)
		if err != nil {
			out.ReadyToUse = false
			continue
		}
		out.Snapshots = append(out.Snapshots, d.csiSnapshot(snap))
	}
	return out
}

// DeleteVolumeGroupSnapshot deletes a group snapshot with its members.
// The snapshot IDs the request names, if any, must be the group's.
func (g *GroupController) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, invalid("group snapshot ID is missing")
	}
	// Another node's group is not gone: deleting it is its node's job.
	gid, err := g.d.localID(req.GetGroupSnapshotId(), "group snapshot", codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	unlock, err := g.d.locks.lock(ctx, "group/"+gid)
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	grp, err := g.d.store.GroupSnapshot(gid)
	if err != nil {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil // never made, or deleted
	}
	if err := g.d.checkMembers(grp, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	if err := g.d.store.DeleteGroupSnapshot(ctx, gid); err != nil {
		return nil, toStatus(err)
	}
	klog.InfoS("group snapshot deleted", "groupSnapshotID", gid)
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

func (g *GroupController) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, invalid("group snapshot ID is missing")
	}
	gid, err := g.d.localID(req.GetGroupSnapshotId(), "group snapshot", codes.NotFound)
	if err != nil {
		return nil, err
	}
	grp, err := g.d.store.GroupSnapshot(gid)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := g.d.checkMembers(grp, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: g.d.csiGroupSnapshot(grp)}, nil
}

// checkMembers accepts snapshot IDs a request names for the group g: none,
// or exactly its members' (in any order); others are InvalidArgument.
func (d *Driver) checkMembers(g blockdev.GroupSnapshot, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	want := make([]string, len(g.Members))
	for i, m := range g.Members {
		want[i] = d.publicID(m.SnapshotID)
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		return invalid("snapshot IDs %s are not the members of group snapshot %s (%s)",
			strings.Join(got, ", "), d.publicID(g.ID), strings.Join(want, ", "))
	}
	return nil
}
