package driver

// ControllerModifyVolume and ControllerExpandVolume: the calls that change
// a volume in place, served on the volume's own node and forwarded there
// over the peer channel when they arrive elsewhere.

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// ControllerModifyVolume changes a volume's mutable parameters, the rate
// limits. The record changes first; a volume staged here then gets them
// on its live device at once, and one staged later from the record.
// A volume of another node is forwarded to that node's plugin over the
// peer channel (the external-resizer is one elected instance for the
// cluster, so it asks its own node's plugin about every node's volumes).
func (s *Controller) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	return s.d.modifyVolume(ctx, req, true)
}

// modifyVolume is ControllerModifyVolume; forward says whether a volume
// of another node goes to its plugin (never for a call from a peer).
func (d *Driver) modifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest, forward bool) (*csi.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume ID is missing")
	}
	if err := checkMutableParams(req.GetMutableParameters()); err != nil {
		return nil, invalid("%v", err)
	}
	if tag, ok := d.elsewhere(id, forward); ok {
		klog.InfoS("forwarding to the volume's node", "volumeID", id, "call", "ControllerModifyVolume", "nodeTag", tag)
		return d.cfg.Peers.ModifyVolume(ctx, tag, req)
	}
	if err := d.classAvailable("volume", id); err != nil {
		return nil, err
	}
	id, err := d.localID(id, "volume", codes.FailedPrecondition)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "modify: %s; %s", status.Convert(err).Message(), d.noPeers())
	}
	v, unlock, err := d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.checkLimits(v.WithMutableParams(req.GetMutableParameters())); err != nil {
		// Parameters this node cannot apply: nothing changes, and the
		// external-resizer marks the change Infeasible with this message.
		return nil, status.Errorf(codes.InvalidArgument, "modify volume %s on node %s: %v", id, d.cfg.NodeID, err)
	}
	if v, err = d.store.ModifyVolume(ctx, id, req.GetMutableParameters()); err != nil {
		return nil, toStatus(fmt.Errorf("modify volume %s: %w", id, err))
	}
	lim, _ := limitsOf(v)
	if ls := d.limitSetter(); ls != nil && v.Node.StagingPath != "" {
		// Not attached (held back at start): Reconcile attaches it with
		// the recorded limits.
		if err := ls.SetLimits(ctx, id, lim); err != nil && !errors.Is(err, blockdev.ErrNotFound) {
			return nil, toStatus(fmt.Errorf("modify volume %s: %w", id, err))
		}
	}
	klog.InfoS("volume modified", "volumeID", id, "limits", lim)
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// ControllerExpandVolume grows a volume's file; NodeExpandVolume grows its
// device and filesystem. A volume of another node is forwarded to that
// node's plugin, as in ControllerModifyVolume.
func (s *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	return s.d.expandVolume(ctx, req, true)
}

// expandVolume is ControllerExpandVolume; forward as in modifyVolume.
func (d *Driver) expandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest, forward bool) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume ID is missing")
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity range is missing")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, invalid("%v", err)
		}
	}
	size, err := sizeFor(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if tag, ok := d.elsewhere(id, forward); ok {
		klog.InfoS("forwarding to the volume's node", "volumeID", id, "call", "ControllerExpandVolume", "nodeTag", tag)
		return d.cfg.Peers.ExpandVolume(ctx, tag, req)
	}
	if err := d.classAvailable("volume", id); err != nil {
		return nil, err
	}
	if id, err = d.localID(id, "volume", codes.FailedPrecondition); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "expand: %s; %s", status.Convert(err).Message(), d.noPeers())
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := d.store.ExpandVolume(ctx, id, size)
	if err != nil {
		return nil, toStatus(fmt.Errorf("expand volume %s: %w", id, err))
	}
	klog.InfoS("volume expanded", "volumeID", id, "size", v.SizeBytes)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.SizeBytes, NodeExpansionRequired: true}, nil
}
