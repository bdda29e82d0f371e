package peer

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Peer is where the plugin of a node serves the peer service.
type Peer struct {
	Node string // the node's name, which its certificate must name
	Addr string // host:port
}

// Resolver finds the plugin of the node whose volume IDs carry tag (the
// node's name, or a hash of a long one).
type Resolver interface {
	Resolve(ctx context.Context, tag string) (Peer, error)
}

// Static is a fixed table of peers by tag, for tests.
type Static map[string]Peer

// Resolve returns the peer of tag.
func (s Static) Resolve(_ context.Context, tag string) (Peer, error) {
	p, ok := s[tag]
	if !ok {
		return Peer{}, fmt.Errorf("no plugin for node tag %q", tag)
	}
	return p, nil
}

// Client forwards calls to the plugins of other nodes.
type Client struct {
	creds *Credentials
	res   Resolver
}

// NewClient returns a client that finds peers with res and proves itself
// with creds.
func NewClient(creds *Credentials, res Resolver) *Client {
	return &Client{creds: creds, res: res}
}

// ModifyVolume asks the plugin of the node tagged tag to modify a volume
// and returns its answer. Secrets stay here.
func (c *Client) ModifyVolume(ctx context.Context, tag string, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	r := proto.Clone(req).(*csi.ControllerModifyVolumeRequest)
	r.Secrets = nil
	resp := new(csi.ControllerModifyVolumeResponse)
	return resp, c.call(ctx, tag, methodModify, r, resp)
}

// ExpandVolume asks the plugin of the node tagged tag to expand a volume
// and returns its answer. Secrets stay here.
func (c *Client) ExpandVolume(ctx context.Context, tag string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	r := proto.Clone(req).(*csi.ControllerExpandVolumeRequest)
	r.Secrets = nil
	resp := new(csi.ControllerExpandVolumeResponse)
	return resp, c.call(ctx, tag, methodExpand, r, resp)
}

// call makes one call on a connection of its own: calls are rare (a
// resize, a change of class) and a fresh resolution and handshake each
// time means a restarted peer's new address and certificate are used at
// once. The call's deadline is ctx's and travels to the peer. The peer's
// answer comes back as it is; a peer that cannot be found or reached is
// Unavailable, which callers retry.
func (c *Client) call(ctx context.Context, tag, method string, req, resp any) error {
	p, err := c.res.Resolve(ctx, tag)
	if err != nil {
		return status.Errorf(codes.Unavailable, "find the plugin of node tag %s: %v", tag, err)
	}
	conn, err := grpc.NewClient("passthrough:///"+p.Addr,
		grpc.WithTransportCredentials(credentials.NewTLS(c.creds.ClientConfig(p.Node))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: %v", p.Node, p.Addr, err)
	}
	defer conn.Close()
	err = conn.Invoke(ctx, method, req, resp)
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: %s", p.Node, p.Addr, st.Message())
	}
	return err
}
