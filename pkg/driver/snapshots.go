package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// CreateSnapshot copies a volume's file. A volume in use is crash-consistent
// in its snapshot: a mounted one's filesystem is frozen while the copy
// catches up with the writes made during a first, live pass; a raw block
// one is held by the backend's IOHolder, or, on the loop backend, which
// cannot hold a device's I/O, flushed and reflinked at one point in time,
// and refused (FailedPrecondition) where the data directory cannot reflink.
func (s *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, invalid("snapshot name is missing")
	}
	if len(name) > maxNameLen {
		return nil, invalid("snapshot name is longer than %d bytes", maxNameLen)
	}
	if src == "" {
		return nil, invalid("source volume ID is missing")
	}
	if len(req.GetParameters()) > 0 {
		return nil, invalid("snapshots take no parameters")
	}
	if err := s.d.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	src, err := s.d.localID(src, "volume", codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	// The source volume's lock keeps it from being staged, unstaged or
	// deleted while it is copied.
	unlock, err := s.d.lockVolume(ctx, src)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := s.d.store.Volume(src)
	if err != nil {
		return nil, toStatus(fmt.Errorf("source volume %s: %w", src, err))
	}
	var hold store.Hold
	if _, err := s.d.store.Snapshot(blockdev.SnapshotID(name)); err != nil {
		// Not taken yet (a repeated call is answered without a copy).
		if hold, err = s.d.holdFor(v); err != nil {
			return nil, err
		}
	}
	snap, err := s.d.store.CreateSnapshotTracked(ctx, name, src, hold, s.d.changeCut(src))
	if err != nil {
		return nil, toStatus(fmt.Errorf("create snapshot %q: %w", name, err))
	}
	klog.InfoS("snapshot created", "snapshotID", snap.ID, "volumeID", src, "size", snap.SizeBytes)
	return &csi.CreateSnapshotResponse{Snapshot: s.d.csiSnapshot(snap)}, nil
}

// holdFor returns how to hold a volume in use steady while it is copied
// (nil when it is not in use), as package quiesce chooses: a frozen
// filesystem, the backend's hold on the device's I/O, or a flushed device
// copied by one reflink; a raw block volume that none of them can hold
// gets FailedPrecondition rather than a torn copy. The means are those of
// the backend whose device serves the volume (deviceBackend), and each
// hold first checks that this device is the one the volume is published
// with (checkHeldDevice). Each hold logs how long it lasted.
func (d *Driver) holdFor(v blockdev.Volume) (store.Hold, error) {
	be := d.deviceBackend(v)
	if be == nil {
		return nil, precondition("volume %s is staged on a %s device, which this plugin (backend %s) does not serve; "+
			"copy it when no pod uses it", v.ID, v.Node.Backend, d.backend.Name())
	}
	holder, _ := be.(blockdev.IOHolder)
	st, _ := d.store.of(v.ID)
	hold, how, err := quiesce.For(v, st.Dir(), holder, st.CanReflink)
	switch {
	case errors.Is(err, quiesce.ErrInconsistent):
		return nil, precondition("volume %s is in use as a raw block device: the %s backend cannot hold its I/O and the data "+
			"directory's filesystem cannot reflink, so a copy would not be crash-consistent; copy it when no pod uses it, "+
			"or use a data directory on xfs (reflink=1) or btrfs", v.ID, be.Name())
	case err != nil:
		return nil, toStatus(err)
	case hold == nil:
		return nil, nil
	}
	return func(ctx context.Context) (func() error, error) {
		if err := checkHeldDevice(ctx, v, be); err != nil {
			return nil, err
		}
		release, err := hold(ctx)
		if err != nil {
			return nil, err
		}
		return logHeld(v.ID, how, release), nil
	}, nil
}

// checkHeldDevice fails, with ErrBusy, unless the device a hold of v is
// about to hold is the device v is published with: its link
// (v.Node.Device) must lead to the device its backend be serves for it,
// and each raw block publication must bind that device's node. (A mounted
// volume's filesystem is checked against the link by its freeze,
// quiesce.FreezeVolume.) A hold of another device would leave the writes
// the pod makes out of the copy's consistency and out of the cut of the
// device's change record.
func checkHeldDevice(ctx context.Context, v blockdev.Volume, be blockdev.Backend) error {
	major, minor, err := blkdev.Number(v.Node.Device)
	if err != nil {
		return fmt.Errorf("hold volume %s: its device %s: %w: %w", v.ID, v.Node.Device, blockdev.ErrBusy, err)
	}
	dev, err := findDeviceOf(ctx, be, v.ID)
	switch {
	case err != nil:
		return fmt.Errorf("hold volume %s: %w", v.ID, err)
	case dev == nil:
		return fmt.Errorf("hold volume %s: the %s backend serves no device for it, its link leads to %s (%d:%d): %w",
			v.ID, be.Name(), v.Node.Device, major, minor, blockdev.ErrBusy)
	}
	ma, mi, err := blkdev.Number(dev.Path)
	if err != nil {
		return fmt.Errorf("hold volume %s: its device %s: %w: %w", v.ID, dev.Path, blockdev.ErrBusy, err)
	}
	if ma != major || mi != minor {
		return fmt.Errorf("hold volume %s: its link leads to %d:%d, the %s backend serves it on %s (%d:%d): %w",
			v.ID, major, minor, be.Name(), dev.Path, ma, mi, blockdev.ErrBusy)
	}
	if !v.Node.Block {
		return nil
	}
	for _, target := range slices.Sorted(maps.Keys(v.Node.Targets)) {
		// The publication is a bind mount of a device node: the node's.
		ta, ti, err := blkdev.Number(target)
		if err != nil {
			continue // not bound any more: nothing writes through it
		}
		if ta != major || ti != minor {
			return fmt.Errorf("hold volume %s: it is published at %s with device %d:%d, not with its device %s (%d:%d): %w",
				v.ID, target, ta, ti, dev.Path, major, minor, blockdev.ErrBusy)
		}
	}
	return nil
}

// logHeld wraps resume so that resuming logs how long the volume was held.
func logHeld(id, what string, resume func() error) func() error {
	start := time.Now()
	return func() error {
		err := resume()
		klog.V(2).InfoS(what+" for a copy", "volumeID", id, "held", time.Since(start), "resumeErr", err)
		return err
	}
}

// csiSnapshot describes a snapshot. Snapshots live on this node's disk, but
// the alpha SNAPSHOT_ACCESSIBILITY_CONSTRAINTS capability is not advertised:
// Kubernetes does not consume it yet, and csi-test v5.6.0 compares the
// returned topology with reflect.DeepEqual on proto messages, which fails
// for equal values.
func (d *Driver) csiSnapshot(s blockdev.Snapshot) *csi.Snapshot {
	_, class := d.store.of(s.ID) // its source's, which may be gone
	return &csi.Snapshot{
		SnapshotId:     d.publicIDIn(s.ID, class),
		SourceVolumeId: d.publicIDIn(s.SourceVolumeID, class),
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
		// A member of a group snapshot goes with its group
		// (DeleteSnapshot refuses it).
		GroupSnapshotId: d.publicID(s.GroupID),
	}
}

func (s *Controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot ID is missing")
	}
	// Another node's snapshot is not gone: deleting it is its node's job.
	id, err := s.d.localID(id, "snapshot", codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	unlock, err := s.d.locks.lock(ctx, "snapshot/"+id)
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	if snap, err := s.d.store.Snapshot(id); err == nil && snap.GroupID != "" {
		if _, err := s.d.store.GroupSnapshot(snap.GroupID); err == nil {
			return nil, invalid("snapshot %s is a member of group snapshot %s: it is deleted with its group (DeleteVolumeGroupSnapshot)",
				req.GetSnapshotId(), s.d.publicID(snap.GroupID))
		}
	}
	if err := s.d.store.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, blockdev.ErrNotFound) {
		return nil, toStatus(fmt.Errorf("delete snapshot %s: %w", id, err))
	}
	klog.InfoS("snapshot deleted", "snapshotID", id)
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *Controller) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, invalid("snapshot ID is missing")
	}
	id, err := s.d.localID(req.GetSnapshotId(), "snapshot", codes.NotFound)
	if err != nil {
		return nil, err
	}
	snap, err := s.d.store.Snapshot(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.GetSnapshotResponse{Snapshot: s.d.csiSnapshot(snap)}, nil
}

func (s *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	// Filters naming another node's objects match nothing here.
	wantID, errID := s.d.localID(req.GetSnapshotId(), "snapshot", codes.NotFound)
	wantSrc, errSrc := s.d.localID(req.GetSourceVolumeId(), "volume", codes.NotFound)
	var all []blockdev.Snapshot
	for _, snap := range s.d.store.Snapshots() {
		if errID != nil || errSrc != nil {
			break
		}
		if wantID != "" && snap.ID != wantID {
			continue
		}
		if wantSrc != "" && snap.SourceVolumeID != wantSrc {
			continue
		}
		all = append(all, snap)
	}
	page, next, err := paginate(all, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, snap := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.d.csiSnapshot(snap)})
	}
	return resp, nil
}

func (s *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	page, next, err := paginate(s.d.store.Volumes(), req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: s.d.csiVolume(v, nil),
			Status: &csi.ListVolumesResponse_VolumeStatus{},
		})
	}
	return resp, nil
}

// paginate returns the page of items (already in a stable order) that starts
// at the index encoded in token. The next token is the index after the page,
// or "" at the end.
func paginate[T any](items []T, token string, max int32) ([]T, string, error) {
	if max < 0 {
		return nil, "", invalid("max_entries must not be negative")
	}
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 || n > len(items) {
			return nil, "", status.Errorf(codes.Aborted, "invalid starting token %q", token)
		}
		start = n
	}
	end := len(items)
	if max > 0 && start+int(max) < end {
		end = start + int(max)
	}
	next := ""
	if end < len(items) {
		next = strconv.Itoa(end)
	}
	return items[start:end], next, nil
}

func wrapInt64(n int64) *wrapperspb.Int64Value { return wrapperspb.Int64(n) }
