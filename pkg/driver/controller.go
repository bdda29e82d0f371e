package driver

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

const (
	// defaultVolumeSize applies when CreateVolume has no capacity range.
	defaultVolumeSize = 1 << 30
	// sizeAlign is the allocation unit; every size is rounded up to it.
	sizeAlign = 4096
	// maxNameLen is the CSI limit for names and IDs.
	maxNameLen = 128
)

// Controller implements csi.ControllerServer for the node's own volumes.
type Controller struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func (s *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpcs := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	}
	if s.d.cfg.ControllerExpansion {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	// Advertised on every backend, so that the external-resizer sends a
	// VolumeAttributesClass change here rather than ignore it: a backend
	// that cannot enforce rate limits refuses them in ControllerModifyVolume
	// (InvalidArgument, an event on the PVC) and accepts lifting them.
	rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	var caps []*csi.ControllerServiceCapability
	for _, t := range rpcs {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	spec, err := s.volumeSpec(req)
	if err != nil {
		return nil, err
	}
	if err := s.d.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	unlock, err := s.d.locks.lock(ctx, "name/"+req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()

	if spec.SourceNode != "" {
		if req.GetParameters()[ParamCrossNodeSource] == crossNodeHandoff {
			return s.d.handoff(ctx, req, spec.SourceNode)
		}
		return s.d.pull(ctx, req, spec)
	}
	if src := spec.SourceVolumeID; src != "" {
		// Hold the source steady: no stage, unstage or delete while it
		// is cloned, and a mounted source is frozen for the copy.
		unlockSrc, err := s.d.lockVolume(ctx, src)
		if err != nil {
			return nil, err
		}
		defer unlockSrc()
		if spec.Hold, err = s.d.cloneHold(spec.Name, src); err != nil {
			return nil, err
		}
	}
	if err := s.d.sizeFromSource(&spec, req.GetCapacityRange()); err != nil {
		return nil, toStatus(err)
	}
	copyCtx, done := ctx, func() {}
	if spec.SourceSnapshotID != "" || spec.SourceVolumeID != "" {
		dl, _ := ctx.Deadline()
		copyCtx, done = s.d.pacedCopy(ctx, dl)
	}
	v, err := s.d.store.CreateVolume(copyCtx, spec)
	done()
	if err != nil {
		return nil, toStatus(fmt.Errorf("create volume %q: %w", req.GetName(), err))
	}
	klog.InfoS("volume created", "volumeID", v.ID, "name", v.Name, "size", v.SizeBytes,
		"snapshot", v.SourceSnapshotID, "clone", v.SourceVolumeID, "preallocation", v.Preallocation)
	return &csi.CreateVolumeResponse{Volume: s.d.csiVolume(v, req.GetVolumeContentSource())}, nil
}

// volumeSpec validates a CreateVolume request into a store spec.
func (s *Controller) volumeSpec(req *csi.CreateVolumeRequest) (store.VolumeSpec, error) {
	var spec store.VolumeSpec
	if req.GetName() == "" {
		return spec, invalid("volume name is missing")
	}
	if len(req.GetName()) > maxNameLen {
		return spec, invalid("volume name is longer than %d bytes", maxNameLen)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return spec, invalid("%v", err)
	}
	if err := checkParams(req.GetParameters()); err != nil {
		return spec, invalid("%v", err)
	}
	if err := checkNodeTuning(req.GetParameters(), runtime.NumCPU()); err != nil {
		return spec, invalid("%v", err)
	}
	if err := checkMutableParams(req.GetMutableParameters()); err != nil {
		return spec, invalid("%v", err)
	}
	size, err := sizeFor(req.GetCapacityRange())
	if err != nil {
		return spec, err
	}
	if size, err = fitFilesystem(size, req.GetCapacityRange(), req.GetVolumeCapabilities(), req.GetParameters()); err != nil {
		return spec, err
	}
	prealloc, _ := preallocationFromParams(req.GetParameters()) // checked above
	spec = store.VolumeSpec{Name: req.GetName(), SizeBytes: size, Params: req.GetParameters(),
		MutableParams: req.GetMutableParameters(), Preallocation: prealloc}
	if err := s.d.checkLimits(blockdev.Volume{Params: spec.Params, MutableParams: spec.MutableParams}); err != nil {
		return spec, invalid("%v", err)
	}
	if src := req.GetVolumeContentSource(); src != nil {
		kind, id := "snapshot", src.GetSnapshot().GetSnapshotId()
		switch {
		case src.GetSnapshot() != nil:
		case src.GetVolume() != nil:
			kind, id = "volume", src.GetVolume().GetVolumeId()
		default:
			return spec, invalid("unsupported volume content source")
		}
		if id == "" {
			return spec, invalid("%s source has no ID", kind)
		}
		if err := sameClass(kind, id, spec.Params); err != nil {
			return spec, err
		}
		// A source on another node is pulled from there over the peer
		// channel (pull.go); without the channel, ResourceExhausted.
		if _, tag := splitID(id); tag != "" && tag != s.d.tag {
			return spec, s.d.remoteSource(&spec, kind, id)
		}
		storeID, err := s.d.localID(id, kind, codes.NotFound)
		if err != nil {
			return spec, err
		}
		if kind == "snapshot" {
			spec.SourceSnapshotID = storeID
		} else {
			spec.SourceVolumeID = storeID
		}
	}
	return spec, nil
}

// sameClass refuses a restore or clone into another device class than its
// source's. Within a class it is a reflink where the filesystem can (the
// same disk), or a copy on that disk; across classes it would always be a
// full copy from one disk to another, of any length, inside the
// provisioner's call, holding a volume in use frozen for it: a choice the
// StorageClass should make visibly, with a class of the source's.
func sameClass(kind, id string, params map[string]string) error {
	_, from, _ := parseID(id)
	if to := className(params); from != to {
		return invalid("%s %s is in device class %s and the StorageClass asks for device class %s: a restore or clone stays in its source's class "+
			"(it shares the source's disk); use a StorageClass with %s: %q", kind, id, from, to, ParamDeviceClass, from)
	}
	return nil
}

// sizeFor turns a capacity range into a size: the required bytes (or the
// default), rounded up to sizeAlign, never above the limit.
func sizeFor(cr *csi.CapacityRange) (int64, error) {
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, invalid("capacity range must not be negative")
	}
	if lim > 0 && req > lim {
		return 0, invalid("required bytes %d exceed limit bytes %d", req, lim)
	}
	size := req
	if size == 0 {
		size = defaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size, err := blockdev.RoundSize(size)
	if err != nil {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d: above the largest volume size, %d bytes", req, int64(blockdev.MaxSize))
	}
	if lim > 0 && size > lim {
		size = lim / sizeAlign * sizeAlign
		if size < req || size == 0 {
			return 0, status.Errorf(codes.OutOfRange, "no multiple of %d bytes lies in [%d, %d]", sizeAlign, req, lim)
		}
	}
	return size, nil
}

// checkClass reports why CreateVolume would refuse a volume with these
// StorageClass parameters on this node, or nil.
func (d *Driver) checkClass(params map[string]string) error {
	if err := checkParams(params); err != nil {
		return err
	}
	if err := checkNodeTuning(params, runtime.NumCPU()); err != nil {
		return err
	}
	return d.checkLimits(blockdev.Volume{Params: params})
}

// checkTopology refuses a volume when the requisite topology excludes this node.
func (d *Driver) checkTopology(req *csi.TopologyRequirement) error {
	if len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if d.topologyMatches(t) {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "requisite topology does not include node %q", d.cfg.NodeID)
}

func (d *Driver) topologyMatches(t *csi.Topology) bool {
	seg := t.GetSegments()
	v, ok := seg[TopologyKey]
	return ok && v == d.cfg.NodeID && len(seg) == 1
}

func (d *Driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{TopologyKey: d.cfg.NodeID}}
}

func (d *Driver) csiVolume(v blockdev.Volume, src *csi.VolumeContentSource) *csi.Volume {
	if src == nil {
		srcID := d.publicID
		if v.SourceNode != "" {
			// Its source's class is its own (sameClass).
			_, class := d.store.of(v.ID)
			srcID = func(id string) string { return formatID(id, class, v.SourceNode) }
		}
		switch {
		case v.SourceSnapshotID != "":
			src = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: srcID(v.SourceSnapshotID)}}}
		case v.SourceVolumeID != "":
			src = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: srcID(v.SourceVolumeID)}}}
		}
	}
	return &csi.Volume{
		VolumeId:           d.publicID(v.ID),
		CapacityBytes:      v.SizeBytes,
		ContentSource:      src,
		AccessibleTopology: []*csi.Topology{d.topology()},
	}
}

func (s *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume ID is missing")
	}
	// Another node's volume is not gone: deleting it is its node's job
	// (the external-provisioner of the PV's node sends it there).
	id, err := s.d.localID(id, "volume", codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	unlock, err := s.d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.d.cancelPull(ctx, id); err != nil {
		return nil, err
	}
	v, err := s.d.store.Volume(id)
	if errors.Is(err, blockdev.ErrNotFound) {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if v.Node.StagingPath != "" {
		return nil, precondition("volume %s is staged at %s", id, v.Node.StagingPath)
	}
	if err := s.d.store.DeleteVolume(ctx, id, s.d.backend.Detach); err != nil {
		return nil, toStatus(fmt.Errorf("delete volume %s: %w", id, err))
	}
	klog.InfoS("volume deleted", "volumeID", id)
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume ID is missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume capabilities are missing")
	}
	id, err := s.d.localID(req.GetVolumeId(), "volume", codes.NotFound)
	if err != nil {
		return nil, err
	}
	v, err := s.d.store.Volume(id)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if err := checkParams(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         v.Params,
	}}, nil
}

func (s *Controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume ID is missing")
	}
	id, err := s.d.localID(req.GetVolumeId(), "volume", codes.NotFound)
	if err != nil {
		return nil, err
	}
	v, err := s.d.store.Volume(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.d.csiVolume(v, nil),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

func (s *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if t := req.GetAccessibleTopology(); t != nil && !s.d.topologyMatches(t) {
		return &csi.GetCapacityResponse{}, nil
	}
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	// Capacity is per StorageClass (the provisioner passes the class's
	// parameters) and comes from its device class's store: a class this
	// node would refuse at CreateVolume, for example one with rate
	// limits on a loop-backend node or a device class it lacks, gets
	// none, so the scheduler places its volumes on nodes that can serve
	// them; why is told to the cluster (Config.NoCapacity).
	var st *store.Store
	err := s.d.checkClass(req.GetParameters())
	if err == nil {
		st, err = s.d.store.get(className(req.GetParameters()))
	}
	if err != nil {
		why := status.Convert(err).Message()
		klog.V(4).InfoS("no capacity for the class", "parameters", req.GetParameters(), "reason", why)
		if s.d.cfg.NoCapacity != nil {
			s.d.cfg.NoCapacity.NoCapacity(req.GetParameters(), why)
		}
		return &csi.GetCapacityResponse{}, nil
	}
	avail, _, err := st.Capacity()
	if p, _ := preallocationFromParams(req.GetParameters()); p != blockdev.PreallocOff && err == nil {
		// Never over-provisioned: a preallocated volume takes its
		// blocks when it is made.
		avail, err = st.PreallocatedCapacity()
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("capacity: %w", err))
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: avail,
		MaximumVolumeSize: wrapInt64(avail),
		MinimumVolumeSize: wrapInt64(sizeAlign),
	}, nil
}
