package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Node implements csi.NodeServer: it attaches volume files as block devices,
// formats and mounts them at the staging path, and bind-mounts them into pods.
type Node struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func (s *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.cfg.NodeID,
		MaxVolumesPerNode:  s.d.cfg.MaxVolumesPerNode,
		AccessibleTopology: s.d.topology(),
	}, nil
}

func (s *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	staging, c := req.GetStagingTargetPath(), req.GetVolumeCapability()
	switch {
	case staging == "":
		return nil, invalid("staging target path is missing")
	case c == nil:
		return nil, invalid("volume capability is missing")
	}
	if err := checkCapability(c); err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkPaths(staging); err != nil {
		return nil, err
	}
	v, unlock, err := s.d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.d.stage(ctx, v, staging, c); err != nil {
		return nil, toStatus(fmt.Errorf("stage %s: %w", id, err))
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	staging := req.GetStagingTargetPath()
	if staging == "" {
		return nil, invalid("staging target path is missing")
	}
	if err := checkPaths(staging); err != nil {
		return nil, err
	}
	v, unlock, err := s.d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.d.unstage(ctx, v, staging); err != nil {
		return nil, toStatus(fmt.Errorf("unstage %s: %w", id, err))
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (s *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	target, c := req.GetTargetPath(), req.GetVolumeCapability()
	switch {
	case target == "":
		return nil, invalid("target path is missing")
	case c == nil:
		return nil, invalid("volume capability is missing")
	}
	if err := checkCapability(c); err != nil {
		return nil, invalid("%v", err)
	}
	if req.GetStagingTargetPath() == "" {
		return nil, precondition("staging target path is missing; the volume must be staged first")
	}
	if err := checkPaths(target, req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	v, unlock, err := s.d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	pub := blockdev.Publish{ReadOnly: req.GetReadonly() || isReadOnlyMode(c), SingleWriter: isSingleWriter(c)}
	if err := s.d.publish(ctx, v, req.GetStagingTargetPath(), target, c, pub); err != nil {
		return nil, toStatus(fmt.Errorf("publish %s at %s: %w", id, target, err))
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	target := req.GetTargetPath()
	if target == "" {
		return nil, invalid("target path is missing")
	}
	if err := checkPaths(target); err != nil {
		return nil, err
	}
	unlock, err := s.d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := s.d.store.Volume(id)
	if errors.Is(err, blockdev.ErrNotFound) {
		// The record is gone; still remove whatever is at the target
		// so that nothing leaks, then report the missing volume. A
		// path another volume is staged or published at belongs to
		// that volume's pod, and stays.
		if other, ok := s.d.volumeUsedAt(target); ok {
			return nil, notFound("volume %s not found; %s is volume %s's, left alone", id, target, other)
		}
		if cerr := s.d.cleanupTarget(target); cerr != nil {
			return nil, toStatus(cerr)
		}
		return nil, notFound("volume %s not found", id)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.d.unpublish(ctx, v, target); err != nil {
		return nil, toStatus(fmt.Errorf("unpublish %s at %s: %w", id, target, err))
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	path := req.GetVolumePath()
	if path == "" {
		return nil, invalid("volume path is missing")
	}
	v, err := s.d.store.Volume(id)
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, notFound("volume path %s: %v", path, err)
	}
	if !usedAt(v.Node, path) {
		return nil, notFound("volume %s is not staged or published at %s", id, path)
	}
	return s.d.volumeStats(path)
}

func (s *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	path := req.GetVolumePath()
	if path == "" {
		return nil, invalid("volume path is missing")
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
	v, unlock, err := s.d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if req.GetCapacityRange() == nil {
		size = v.SizeBytes
	}
	got, err := s.d.expand(ctx, v, path, size)
	if err != nil {
		return nil, toStatus(fmt.Errorf("expand %s: %w", id, err))
	}
	klog.InfoS("volume expanded on node", "volumeID", id, "size", got)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: got}, nil
}

// checkPaths accepts only absolute, clean paths that a system call can
// take: kubelet always sends those, and anything else ("../x", "a//b")
// could reach somewhere it did not mean (or, with a NUL or over Linux's
// length limits, fail in the system call).
func checkPaths(paths ...string) error {
	for _, p := range paths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.IndexByte(p, 0) >= 0 || !fitsPathMax(p) {
			return invalid("path %q must be absolute, clean, without NUL and within PATH_MAX and NAME_MAX", p)
		}
	}
	return nil
}

// fitsPathMax reports whether p fits PATH_MAX (4096 bytes with its NUL)
// and each of its elements NAME_MAX (255 bytes).
func fitsPathMax(p string) bool {
	if len(p) >= 4096 {
		return false
	}
	for el := range strings.SplitSeq(p, "/") {
		if len(el) > 255 {
			return false
		}
	}
	return true
}
