package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// The SnapshotMetadata service (issue 42) is reached through one address
// for the whole cluster: the SnapshotMetadataService object names a
// Service in front of every node's csi-snapshot-metadata sidecar, so the
// sidecar that takes a backup application's call, and the plugin behind
// it, are those of any node. Each node holds only its own snapshots. The
// plugin therefore answers for a snapshot it holds, and forwards the call
// for a snapshot whose ID names another node to that node's plugin over
// the peer channel, relaying the answer's messages in order
// (docs/snapshot-metadata.md). The sidecar has already authenticated and
// authorized the caller; a forwarded call carries no secrets, and the
// node that gets it answers only for its own snapshots and never forwards
// again.

// MetadataForwarder is a Forwarder that also carries SnapshotMetadata
// calls to the node that holds the snapshot (tag: that node's tag in
// snapshot IDs) and passes each message of its answer to send, in order.
// pkg/peer's Client is one.
type MetadataForwarder interface {
	GetMetadataAllocated(ctx context.Context, tag string, req *csi.GetMetadataAllocatedRequest, send func(*csi.GetMetadataAllocatedResponse) error) error
	GetMetadataDelta(ctx context.Context, tag string, req *csi.GetMetadataDeltaRequest, send func(*csi.GetMetadataDeltaResponse) error) error
}

var (
	_ MetadataForwarder    = (*peer.Client)(nil)
	_ peer.MetadataHandler = (*PeerService)(nil)
)

// registerSnapshotMetadata serves the SnapshotMetadata service on srv, the
// CSI socket, routed, when this node has one.
func (d *Driver) registerSnapshotMetadata(srv *grpc.Server) {
	if d.snapMeta != nil {
		csi.RegisterSnapshotMetadataServer(srv, &metadataRouter{d: d, local: d.snapMeta})
	}
}

// metadataRouter is the SnapshotMetadata service of the CSI socket: local
// answers for this node's snapshots, the owner's plugin for the others'.
type metadataRouter struct {
	csi.UnimplementedSnapshotMetadataServer
	d     *Driver
	local csi.SnapshotMetadataServer
}

// GetMetadataAllocated answers for the snapshot's own node.
func (r *metadataRouter) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, st csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	fw, tag, err := r.d.metadataOwner(req.GetSnapshotId())
	if err != nil {
		return err
	}
	if fw == nil {
		return r.local.GetMetadataAllocated(req, st)
	}
	klog.V(2).InfoS("snapshot metadata forwarded", "call", "GetMetadataAllocated", "snapshotID", req.GetSnapshotId(), "node", tagNode(tag))
	return fw.GetMetadataAllocated(st.Context(), tag, req, st.Send)
}

// GetMetadataDelta answers for the node of the target snapshot: both
// snapshots of one volume live on the volume's node, and that node's own
// service says what it makes of a base snapshot it does not hold. Two
// snapshots tagged with different nodes are no snapshots of one volume:
// this node's service refuses them (InvalidArgument) without a forward.
func (r *metadataRouter) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, st csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	_, baseTag := splitID(req.GetBaseSnapshotId())
	_, targetTag := splitID(req.GetTargetSnapshotId())
	if baseTag != "" && targetTag != "" && baseTag != targetTag {
		return r.local.GetMetadataDelta(req, st)
	}
	fw, tag, err := r.d.metadataOwner(req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	if fw == nil {
		return r.local.GetMetadataDelta(req, st)
	}
	klog.V(2).InfoS("snapshot metadata forwarded", "call", "GetMetadataDelta", "baseSnapshotID", req.GetBaseSnapshotId(),
		"targetSnapshotID", req.GetTargetSnapshotId(), "node", tagNode(tag))
	return fw.GetMetadataDelta(st.Context(), tag, req, st.Send)
}

// metadataOwner says who answers for the snapshot id: this node (a nil
// forwarder) when it holds the snapshot or when the ID names no other node
// (this node's service then gives the spec's InvalidArgument or
// NotFound); else the forwarder and the owner's tag. Without a peer
// channel a snapshot of another node is FailedPrecondition: no retry
// reaches it.
func (d *Driver) metadataOwner(id string) (MetadataForwarder, string, error) {
	if d.HoldsSnapshot(id) {
		return nil, "", nil
	}
	storeID, tag := splitID(id)
	if tag == "" || tag == d.tag || !blockdev.IsSnapshotID(storeID) {
		return nil, "", nil
	}
	fw, ok := d.cfg.Peers.(MetadataForwarder)
	if !ok {
		return nil, "", status.Errorf(codes.FailedPrecondition,
			"snapshot %s lives on %s, not on node %s, and the peer channel that reaches it is off (--peer-address)", id, tagNode(tag), d.cfg.NodeID)
	}
	return fw, tag, nil
}

// peerMetadata is this node's own service for a call a peer forwarded for
// the snapshot id: only a snapshot ID of this node is served, never
// forwarded again.
func (d *Driver) peerMetadata(id string) (csi.SnapshotMetadataServer, error) {
	if !d.cfg.PeerMetadata {
		return nil, status.Errorf(codes.PermissionDenied, "node %s serves no snapshot metadata to peers (--peer-serve-metadata, set with the chart's snapshotMetadata.enabled)", d.cfg.NodeID)
	}
	storeID, tag := splitID(id)
	if tag != d.tag || !blockdev.IsSnapshotID(storeID) {
		return nil, status.Errorf(codes.InvalidArgument, "peer snapshot metadata call for %q: not a snapshot ID of node %s", id, d.cfg.NodeID)
	}
	if d.snapMeta == nil {
		return nil, status.Errorf(codes.Unimplemented, "node %s's plugin offers no snapshot metadata", d.cfg.NodeID)
	}
	return d.snapMeta, nil
}

// GetMetadataAllocated is GetMetadataAllocated for a peer.
func (p *PeerService) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, st csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	local, err := p.d.peerMetadata(req.GetSnapshotId())
	if err != nil {
		return err
	}
	caller, _ := peer.Caller(st.Context())
	klog.InfoS("snapshot metadata for a peer", "call", "GetMetadataAllocated", "snapshotID", req.GetSnapshotId(), "peer", caller.Node)
	return local.GetMetadataAllocated(req, st)
}

// GetMetadataDelta is GetMetadataDelta for a peer, for a target snapshot
// of this node.
func (p *PeerService) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, st csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	local, err := p.d.peerMetadata(req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	caller, _ := peer.Caller(st.Context())
	klog.InfoS("snapshot metadata for a peer", "call", "GetMetadataDelta", "baseSnapshotID", req.GetBaseSnapshotId(),
		"targetSnapshotID", req.GetTargetSnapshotId(), "peer", caller.Node)
	return local.GetMetadataDelta(req, st)
}
