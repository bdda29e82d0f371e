package driver

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// Forwarder sends a controller call for a volume of another node to the
// plugin of that node (tag: the node's tag in volume IDs, ids.go) and
// returns that plugin's answer. pkg/peer's Client is one.
type Forwarder interface {
	ModifyVolume(ctx context.Context, tag string, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error)
	ExpandVolume(ctx context.Context, tag string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	// CreateVolume makes on that node a volume from a source of that
	// node (a handoff).
	CreateVolume(ctx context.Context, tag string, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	// ReadData streams the data of an object of that node into sink,
	// checked (pull.go); a stream idle for idle is cut.
	ReadData(ctx context.Context, tag string, req *peer.ReadRequest, sink peer.Sink, idle time.Duration) (peer.Received, error)
}

// NodeTag is the tag of the node nodeID in volume and snapshot IDs: what
// a Forwarder's resolver matches nodes by.
func NodeTag(nodeID string) string { return nodeTag(nodeID) }

// elsewhere reports whether the volume id lives on another node whose
// plugin gets the call, and that node's tag.
func (d *Driver) elsewhere(id string, forward bool) (string, bool) {
	_, tag := splitID(id)
	return tag, forward && d.cfg.Peers != nil && tag != "" && tag != d.tag
}

// noPeers says why a call for another node's volume was not forwarded.
func (d *Driver) noPeers() string {
	if d.cfg.Peers != nil {
		return "a call from a peer is never forwarded again"
	}
	return fmt.Sprintf("the peer channel is off on node %s (--peer-address), so calls for other nodes' volumes are refused", d.cfg.NodeID)
}

// PeerService answers the calls other nodes' plugins forward to this one
// (pkg/peer's Handler). It serves this node's volumes only, named by an
// ID tagged with this node: anything else is refused before it reaches
// the store, and nothing is forwarded again.
type PeerService struct{ d *Driver }

// PeerService returns the service of calls from peers.
func (d *Driver) PeerService() *PeerService { return &PeerService{d: d} }

// ModifyVolume is ControllerModifyVolume for a peer.
func (p *PeerService) ModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if err := p.d.checkPeerID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := p.d.authorizeVolume(req.GetVolumeId(), func(az PeerAuthorizer, pv string) error {
		return az.Modify(ctx, req.GetVolumeId(), pv, req.GetMutableParameters())
	}); err != nil {
		return nil, err
	}
	return p.d.modifyVolume(ctx, req, false)
}

// ExpandVolume is ControllerExpandVolume for a peer.
func (p *PeerService) ExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := p.d.checkPeerID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	size, err := sizeFor(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if err := p.d.authorizeVolume(req.GetVolumeId(), func(az PeerAuthorizer, pv string) error {
		return az.Expand(ctx, req.GetVolumeId(), pv, size)
	}); err != nil {
		return nil, err
	}
	return p.d.expandVolume(ctx, req, false)
}

// CreateVolume is a CreateVolume another node handed off to this one
// (handoff): its source must be this node's own, so that the volume is
// made here from it as any local restore or clone is, and never handed
// off or pulled again. The requester's topology requirements (its own
// node, with --strict-topology) do not apply: the volume goes where its
// source is, and its topology says so.
func (p *PeerService) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	src := req.GetVolumeContentSource()
	id := src.GetSnapshot().GetSnapshotId() + src.GetVolume().GetVolumeId()
	if _, tag := splitID(id); tag != p.d.tag {
		return nil, status.Errorf(codes.InvalidArgument, "peer CreateVolume %q: its source %q is not an object of node %s", req.GetName(), id, p.d.cfg.NodeID)
	}
	caller, _ := peer.Caller(ctx)
	if az := p.d.cfg.PeerAuthz; az != nil {
		kind := peer.SourceVolume
		if src.GetSnapshot() != nil {
			kind = peer.SourceSnapshot
		}
		claim := req.GetParameters()[ParamPVCNamespace] + "/" + req.GetParameters()[ParamPVCName]
		if err := az.Read(ctx, caller.Node, claim, kind, id); err != nil {
			return nil, err
		}
	}
	r := proto.Clone(req).(*csi.CreateVolumeRequest)
	r.AccessibilityRequirements = nil
	klog.InfoS("volume handed off by a peer", "name", req.GetName(), "source", id, "peer", caller.Node)
	return (&Controller{d: p.d}).CreateVolume(ctx, r)
}

// handoff answers CreateVolume for a volume whose source lives on the node
// tagged tag by having that node make it (ParamCrossNodeSource=handoff):
// the answer is that node's, its volume ID and topology, so the scheduler
// moves the pod there.
func (d *Driver) handoff(ctx context.Context, req *csi.CreateVolumeRequest, tag string) (*csi.CreateVolumeResponse, error) {
	resp, err := d.cfg.Peers.CreateVolume(ctx, tag, req)
	if err != nil {
		return nil, err
	}
	klog.InfoS("volume handed off to the source's node", "volumeID", resp.GetVolume().GetVolumeId(), "name", req.GetName(), "node", tagNode(tag))
	return resp, nil
}

// OpenSource opens what a peer pulls for a restore or clone (pkg/peer's
// ReadData): a snapshot of this node as it is, or a point-in-time copy of
// a volume of this node, taken as its snapshots are (held steady if in
// use) and unlinked at once, so that nothing of it outlives the stream.
// Only IDs of this node of the right kind are served; the source is only
// read.
func (p *PeerService) OpenSource(ctx context.Context, req *peer.ReadRequest) (*os.File, int64, error) {
	d := p.d
	storeID, tag := splitID(req.ID)
	caller, _ := peer.Caller(ctx)
	var f *os.File
	var size int64
	var err error
	switch req.Kind {
	case peer.SourceSnapshot:
		if tag != d.tag || !blockdev.IsSnapshotID(storeID) {
			return nil, 0, status.Errorf(codes.InvalidArgument, "peer read of %q: not a snapshot ID of node %s", req.ID, d.cfg.NodeID)
		}
		if err := d.authorizeRead(ctx, caller.Node, req); err != nil {
			return nil, 0, err
		}
		f, size, err = d.store.OpenSnapshot(ctx, storeID)
	case peer.SourceVolume:
		if err := d.checkPeerID(req.ID); err != nil {
			return nil, 0, err
		}
		if err := d.authorizeRead(ctx, caller.Node, req); err != nil {
			return nil, 0, err
		}
		f, size, err = d.peerCopies.open(storeID, caller.Node, req.Target, func() (*os.File, int64, error) { return d.copyForPeer(ctx, storeID) })
	default:
		return nil, 0, status.Errorf(codes.InvalidArgument, "peer read of %q: unknown %v", req.ID, req.Kind)
	}
	if err != nil {
		return nil, 0, toStatus(err)
	}
	klog.InfoS("sending data to a peer", "source", storeID, "kind", req.Kind, "for", req.Target, "peer", caller.Node, "size", size, "rate", req.Rate)
	return f, size, nil
}

// SourceSent is told how a stream of a source ended (pkg/peer's
// SourceFinisher): the copy of a volume is let go after a stream that
// sent it all, and kept a while for the retry after one that failed.
func (p *PeerService) SourceSent(ctx context.Context, req *peer.ReadRequest, err error) {
	if req.Kind == peer.SourceVolume {
		storeID, _ := splitID(req.ID)
		p.d.peerCopies.sent(storeID, err)
	}
}

// copyForPeer takes the point-in-time copy of the volume id a peer
// clones, holding the volume as a local clone does.
func (d *Driver) copyForPeer(ctx context.Context, id string) (*os.File, int64, error) {
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer unlock()
	v, err := d.store.Volume(id)
	if err != nil {
		return nil, 0, err
	}
	hold, err := d.holdFor(v)
	if err != nil {
		return nil, 0, err
	}
	ctx, done := d.pacedCopy(ctx, peerCopyTime())
	defer done()
	return d.store.CopyVolume(ctx, id, hold)
}

// authorizeRead asks the PeerAuthorizer, if any, whether node may read
// what req names for its claim.
func (d *Driver) authorizeRead(ctx context.Context, node string, req *peer.ReadRequest) error {
	if d.cfg.PeerAuthz == nil {
		return nil
	}
	return d.cfg.PeerAuthz.Read(ctx, node, req.Claim, req.Kind, req.ID)
}

// authorizeVolume asks the PeerAuthorizer, if any, about the volume id by
// its PV's name (the name the volume was made with). A volume this node
// does not have is left to the call, which answers NotFound.
func (d *Driver) authorizeVolume(id string, ask func(az PeerAuthorizer, pv string) error) error {
	if d.cfg.PeerAuthz == nil {
		return nil
	}
	storeID, _ := splitID(id)
	v, err := d.store.Volume(storeID)
	if err != nil {
		return nil
	}
	return ask(d.cfg.PeerAuthz, v.Name)
}

// checkPeerID accepts only a volume ID of this node: a store ID of the
// fixed alphabet (blockdev.ValidID) and this node's tag.
func (d *Driver) checkPeerID(id string) error {
	storeID, tag := splitID(id)
	if tag != d.tag || !blockdev.IsVolumeID(storeID) {
		return status.Errorf(codes.InvalidArgument, "peer call for %q: not a volume ID of node %s", id, d.cfg.NodeID)
	}
	return nil
}

// LogAndRecover is the interceptor of the CSI socket (every call logged,
// panics turned into Internal), for the peer server.
func LogAndRecover(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return logAndRecover(ctx, req, info, handler)
}
