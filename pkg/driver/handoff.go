package driver

import (
	"context"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// A handoff (crossNodeSource: handoff) has the source's node make a
// restore's or clone's volume, which then serves a claim of another node.
// The caller may be a stolen node, so what it can make here is bounded:
// the volume is made as its claim asks (PeerAuthorizer.Handoff: its
// name from the claim's uid, size, class parameters, preallocation
// included, and attributes class), never as the caller's request says; a
// peer may have at most HandoffLimits of them waiting for their PVs; and a
// volume whose PV does not come within ReapAfter is removed. The record of
// each such volume names the peer (Volume.HandoffPeer) until its PV is
// seen, so the count and the removal survive a restart.

// HandoffLimits bound the volumes handoffs make on this node for one peer
// before their PVs come. A zero field takes DefaultHandoffLimits'.
type HandoffLimits struct {
	// PerPeer is the most such volumes one peer may have; beyond it a
	// handoff is Unavailable (retried).
	PerPeer int
	// BytesPerPeer is the most bytes they may hold together; a handoff
	// for a peer that has none waiting is never refused by it.
	BytesPerPeer int64
	// ReapAfter is how long a volume a handoff made may wait for its PV
	// before it is removed.
	ReapAfter time.Duration
}

// DefaultHandoffLimits are the plugin's flags' defaults. This node makes
// a handed-off volume's PV as soon as the volume is made (handoffpv.go),
// and the requester's provisioner retries a handoff whose PV failed: an
// hour leaves many tries.
var DefaultHandoffLimits = HandoffLimits{PerPeer: 8, BytesPerPeer: 1 << 40, ReapAfter: time.Hour}

func (l HandoffLimits) withDefaults() HandoffLimits {
	d := DefaultHandoffLimits
	if l.PerPeer <= 0 {
		l.PerPeer = d.PerPeer
	}
	if l.BytesPerPeer <= 0 {
		l.BytesPerPeer = d.BytesPerPeer
	}
	if l.ReapAfter <= 0 {
		l.ReapAfter = d.ReapAfter
	}
	return l
}

// handoffs are the handoffs being made, by volume name: what they will
// hold before their records say so.
type handoffs struct {
	mu      sync.Mutex
	making  map[string]handoffMaking
	reaping sync.Mutex // one pass at a time
}

type handoffMaking struct {
	peer string
	size int64
}

// CreateVolume is a CreateVolume another node handed off to this one
// (handoff): its source must be this node's own, so that the volume is
// made here from it as any local restore or clone is, and never handed
// off or pulled again. The requester's topology requirements (its own
// node, with --strict-topology) do not apply: the volume goes where its
// source is, and its topology says so. With a PeerAuthorizer the volume
// is made as its claim asks.
func (p *PeerService) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d := p.d
	src := req.GetVolumeContentSource()
	id := src.GetSnapshot().GetSnapshotId() + src.GetVolume().GetVolumeId()
	if _, tag := splitID(id); tag != d.tag {
		return nil, status.Errorf(codes.InvalidArgument, "peer CreateVolume %q: its source %q is not an object of node %s", req.GetName(), id, d.cfg.NodeID)
	}
	caller, _ := peer.Caller(ctx)
	r := proto.Clone(req).(*csi.CreateVolumeRequest)
	r.AccessibilityRequirements = nil
	if az := d.cfg.PeerAuthz; az != nil {
		kind := peer.SourceVolume
		if src.GetSnapshot() != nil {
			kind = peer.SourceSnapshot
		}
		claim := req.GetParameters()[ParamPVCNamespace] + "/" + req.GetParameters()[ParamPVCName]
		if err := az.Read(ctx, caller.Node, claim, kind, id); err != nil {
			return nil, err
		}
		asked, err := az.Handoff(ctx, claim)
		if err != nil {
			return nil, err
		}
		if req.GetName() != asked.GetName() {
			return nil, denied("the volume a handoff makes for claim %s is %s (the provisioner's name, from the claim's uid), not %q", claim, asked.GetName(), req.GetName())
		}
		r.CapacityRange, r.Parameters, r.MutableParameters = asked.GetCapacityRange(), asked.GetParameters(), asked.GetMutableParameters()
	}
	size, err := sizeFor(r.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	release, err := d.admitHandoff(caller.Node, r.GetName(), size)
	if err != nil {
		return nil, err
	}
	defer release()
	klog.InfoS("volume handed off by a peer", "name", r.GetName(), "source", id, "peer", caller.Node, "size", size)
	resp, err := (&Controller{d: d}).createVolume(ctx, r, caller.Node)
	if err != nil {
		return nil, err
	}
	if m, ok := d.cfg.PeerAuthz.(handoffPVMaker); ok {
		if err := m.HandoffPV(ctx, req, resp.GetVolume()); err != nil {
			return nil, err // the volume waits for its PV: the retry makes it, or the reaper removes the volume
		}
		// Its PV came: the volume is the PV's and counts no more
		// against the peer's limits.
		made, _ := splitID(resp.GetVolume().GetVolumeId())
		if _, err := d.store.AdoptHandoff(ctx, made); err != nil {
			return nil, status.Errorf(codes.Internal, "handoff: volume %s: %v", resp.GetVolume().GetVolumeId(), err)
		}
	}
	return resp, nil
}

// admitHandoff admits a handoff of node for the volume name of size
// bytes within the HandoffLimits, or says which is full (Unavailable: the
// provisioner retries); release ends its place among those being made.
// A volume that exists already is a repeat and takes no new place.
func (d *Driver) admitHandoff(node, name string, size int64) (release func(), err error) {
	lim := d.cfg.Handoffs.withDefaults()
	h := &d.handoffs
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := d.store.Volume(blockdev.VolumeID(name)); err == nil {
		return func() {}, nil
	}
	if _, ok := h.making[name]; ok {
		return func() {}, nil // a repeat: its create waits for the first (the name's lock)
	}
	count, bytes := 0, int64(0)
	for _, v := range d.store.Volumes() {
		if v.HandoffPeer == node {
			count++
			bytes += v.SizeBytes
		}
	}
	for n, m := range h.making {
		if _, err := d.store.Volume(blockdev.VolumeID(n)); m.peer == node && err != nil {
			count++
			bytes += m.size
		}
	}
	switch {
	case count >= lim.PerPeer:
		return nil, status.Errorf(codes.Unavailable, "node %s already has %d volumes made here by handoffs whose PVs have not come, the most one peer may have (--peer-max-handoffs-per-peer); retry later",
			node, count)
	case count > 0 && bytes+size > lim.BytesPerPeer:
		return nil, status.Errorf(codes.Unavailable, "node %s already has %d bytes in volumes made here by handoffs whose PVs have not come; %d more is above the most one peer may have, %d (--peer-max-handoff-bytes-per-peer); retry later",
			node, bytes, size, lim.BytesPerPeer)
	}
	if h.making == nil {
		h.making = map[string]handoffMaking{}
	}
	h.making[name] = handoffMaking{peer: node, size: size}
	return func() {
		h.mu.Lock()
		delete(h.making, name)
		h.mu.Unlock()
	}, nil
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
	if _, ok := d.cfg.PeerAuthz.(handoffPVMaker); ok {
		// That node made the PV (handoffpv.go): this node's account may
		// not make another node's.
		return nil, errHandedOff(resp.GetVolume(), tagNode(tag))
	}
	return resp, nil
}

// reapEvery is how often ReapHandoffs looks, at most: a volume whose PV
// came stops counting against its peer's limit within it.
const reapEvery = 30 * time.Second

// ReapHandoffs looks at the volumes handoffs made here until ctx ends:
// one whose PV has come is the PV's from then on, one whose PV has not
// come within ReapAfter is removed (reapHandoffs). Without a
// PeerAuthorizer (no API server) it does nothing.
func (d *Driver) ReapHandoffs(ctx context.Context) {
	if d.cfg.PeerAuthz == nil {
		return
	}
	every := min(reapEvery, d.cfg.Handoffs.withDefaults().ReapAfter/4)
	for {
		d.reapHandoffs(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// reapHandoffs is one pass of ReapHandoffs at now. Each volume is decided
// under its name's lock (no repeat of its handoff meanwhile); when the
// API server cannot say whether its PV exists, it is left as it is.
// Removing is DeleteVolume's: idempotent, and a crash midway leaves what
// the next pass removes.
func (d *Driver) reapHandoffs(ctx context.Context, now time.Time) {
	d.handoffs.reaping.Lock()
	defer d.handoffs.reaping.Unlock()
	after := d.cfg.Handoffs.withDefaults().ReapAfter
	for _, v := range d.store.Volumes() {
		if v.HandoffPeer != "" {
			d.reapHandoff(ctx, v.ID, now, after)
		}
	}
}

func (d *Driver) reapHandoff(ctx context.Context, id string, now time.Time, after time.Duration) {
	v, err := d.store.Volume(id)
	if err != nil {
		return
	}
	unlock, err := d.locks.lock(ctx, "name/"+v.Name)
	if err != nil {
		return
	}
	defer unlock()
	if v, err = d.store.Volume(id); err != nil || v.HandoffPeer == "" {
		return
	}
	public := d.publicID(id)
	has, err := d.cfg.PeerAuthz.HasPV(ctx, v.Name, public)
	switch {
	case err != nil:
		klog.ErrorS(err, "volume made by a handoff: cannot tell whether its PV came; kept", "volumeID", id, "name", v.Name, "peer", v.HandoffPeer)
	case has:
		if _, err := d.store.AdoptHandoff(ctx, id); err != nil {
			klog.ErrorS(err, "volume made by a handoff: its PV came, but its record was not updated", "volumeID", id)
		}
	case now.Sub(v.CreatedAt) >= after:
		klog.InfoS("removing a volume a handoff made whose PV did not come", "volumeID", id, "name", v.Name, "peer", v.HandoffPeer,
			"created", v.CreatedAt, "after", after)
		if _, err := (&Controller{d: d}).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: public}); err != nil {
			klog.ErrorS(err, "volume made by a handoff: not removed", "volumeID", id)
		}
	}
}
