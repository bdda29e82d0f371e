package driver

import (
	"context"
	"net"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// Relay is the CSI service of the controller Deployment (`csi-fastblk
// controller`), which holds no volume: the external-resizer, one elected
// instance for the cluster, calls it, and it sends each
// ControllerExpandVolume and ControllerModifyVolume to the plugin of the
// volume's node over the peer channel, answering with that node's answer.
// The resizer runs there, under the controller's own account, so that no
// node's account may write other nodes' PVs and claims.
type Relay struct {
	name, version string
	expansion     bool
	peers         Forwarder
}

// NewRelay returns the Relay of the driver name; expansion advertises
// ControllerExpandVolume (--controller-expansion); peers reaches the
// volumes' nodes (nil: every call is refused, saying the channel is off).
func NewRelay(name, version string, expansion bool, peers Forwarder) *Relay {
	return &Relay{name: name, version: version, expansion: expansion, peers: peers}
}

// Serve serves the Identity and Controller services on lis until ctx ends.
func (r *Relay) Serve(ctx context.Context, lis net.Listener) error {
	srv := grpc.NewServer(grpc.UnaryInterceptor(logAndRecover))
	csi.RegisterIdentityServer(srv, relayIdentity{r: r})
	csi.RegisterControllerServer(srv, relayController{r: r})
	return serveUntil(ctx, srv, lis)
}

type relayIdentity struct {
	csi.UnimplementedIdentityServer
	r *Relay
}

func (s relayIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.r.name, VendorVersion: s.r.version}, nil
}

func (s relayIdentity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
			Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

func (s relayIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

type relayController struct {
	csi.UnimplementedControllerServer
	r *Relay
}

func (s relayController) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpcs := []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_MODIFY_VOLUME}
	if s.r.expansion {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	return controllerCapabilities(rpcs), nil
}

// node is the tag of the node that holds the volume id, checked as the
// plugin checks it before it forwards.
func (r *Relay) node(call, id string) (string, error) {
	if id == "" {
		return "", invalid("volume ID is missing")
	}
	if r.peers == nil {
		return "", status.Errorf(codes.FailedPrecondition, "%s of %s: the peer channel is off (peer.enabled), so the controller cannot reach the volume's node", call, id)
	}
	_, tag := splitID(id)
	if tag == "" {
		return "", status.Errorf(codes.FailedPrecondition, "%s of %s: the volume ID names no node (a volume made before IDs carried their node), so the controller cannot tell where it lives", call, id)
	}
	klog.InfoS("forwarding to the volume's node", "volumeID", id, "call", call, "nodeTag", tag)
	return tag, nil
}

func (s relayController) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if err := checkMutableParams(req.GetMutableParameters()); err != nil {
		return nil, invalid("%v", err)
	}
	tag, err := s.r.node("ControllerModifyVolume", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return s.r.peers.ModifyVolume(ctx, tag, req)
}

func (s relayController) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if !s.r.expansion {
		return nil, status.Error(codes.Unimplemented, "ControllerExpandVolume is not advertised (--controller-expansion is off)")
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity range is missing")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, invalid("%v", err)
		}
	}
	if _, err := sizeFor(req.GetCapacityRange()); err != nil {
		return nil, err
	}
	tag, err := s.r.node("ControllerExpandVolume", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return s.r.peers.ExpandVolume(ctx, tag, req)
}
