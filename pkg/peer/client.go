package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
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
	tok   *Tokens
}

// NewClient returns a client that finds peers with res and proves itself
// with creds.
func NewClient(creds *Credentials, res Resolver) *Client {
	return &Client{creds: creds, res: res}
}

// WithTokens makes c prove its node with t's token on every call and take
// answers only from the plugin pod of the node it meant (token.go). Call
// it before c is used.
func (c *Client) WithTokens(t *Tokens) *Client {
	c.tok = t
	return c
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

// CreateVolume asks the plugin of the node tagged tag to make a volume
// from one of its own sources and returns its answer. Secrets stay here.
func (c *Client) CreateVolume(ctx context.Context, tag string, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	r := proto.Clone(req).(*csi.CreateVolumeRequest)
	r.Secrets = nil
	resp := new(csi.CreateVolumeResponse)
	return resp, c.call(ctx, tag, methodCreate, r, resp)
}

// ReadData asks the plugin of the node tagged tag for the data req names
// and writes it to sink (see receive: every frame and the whole stream are
// checked). The stream lasts until the data is in, ctx ends, or either end
// fails; a stream idle for idle (no frame) is cut, so that a peer gone
// without a word (a node down, a cut network) does not hold it for ever.
func (c *Client) ReadData(ctx context.Context, tag string, req *ReadRequest, sink Sink, idle time.Duration) (Received, error) {
	conn, p, err := c.dial(ctx, tag)
	if err != nil {
		return Received{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errIdle := status.Errorf(codes.Unavailable, "plugin of node %s at %s sent nothing for %v", p.Node, p.Addr, idle)
	watchdog := time.AfterFunc(idle, func() { cancel(errIdle) })
	defer watchdog.Stop()
	desc := &serviceDesc.Streams[0]
	if req.Claim != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, mdClaim, req.Claim)
	}
	// Nothing of the data is taken before the server proved itself the
	// plugin of p's node.
	st, err, proofErr := c.openStream(ctx, conn, p, desc, methodReadData, req, new(Frame),
		grpc.CallContentSubtype(xferCodec), grpc.MaxCallRecvMsgSize(maxFrame))
	if proofErr != nil {
		return Received{}, proofErr
	}
	if err != nil {
		if errors.Is(context.Cause(ctx), errIdle) {
			return Received{}, errIdle
		}
		return Received{}, c.unavailable(p, err)
	}
	got, err := receive(func(f *Frame) error {
		err := st.RecvMsg(f)
		watchdog.Reset(idle)
		return err
	}, sink)
	if cause := context.Cause(ctx); errors.Is(cause, errIdle) {
		return got, errIdle
	}
	return got, c.unavailable(p, err)
}

// openStream opens a stream of method to p on conn, sends req as its one
// request and checks the server's proof (serverProof, end for a stream
// that ends before its headers): streamErr is the stream's failure,
// proofErr the server's.
func (c *Client) openStream(ctx context.Context, conn *grpc.ClientConn, p Peer, desc *grpc.StreamDesc, method string, req, end any,
	opts ...grpc.CallOption) (st grpc.ClientStream, streamErr, proofErr error) {
	st, err := conn.NewStream(ctx, desc, method, opts...)
	if err == nil {
		err = st.SendMsg(req)
	}
	if err == nil {
		err = st.CloseSend()
	}
	if err != nil {
		return st, err, nil
	}
	streamErr, proofErr = c.serverProof(ctx, st, p, end)
	return st, streamErr, proofErr
}

// serverProof checks, with tokens, that the server of the stream st to p
// proved itself the plugin of p's node in its headers, before anything it
// sends is taken: proofErr says it did not. A stream that ended before
// its headers gives instead the error of its end (streamErr: a refusal
// comes with its end), received into end.
func (c *Client) serverProof(ctx context.Context, st grpc.ClientStream, p Peer, end any) (streamErr, proofErr error) {
	if c.tok == nil {
		return nil, nil
	}
	hdr, _ := st.Header()
	if hdr == nil {
		if streamErr = st.RecvMsg(end); streamErr == nil || errors.Is(streamErr, io.EOF) {
			streamErr = status.Error(codes.Unavailable, "the stream ended without headers")
		}
		return streamErr, nil
	}
	return nil, c.tok.checkServer(ctx, hdr, p)
}

// dial resolves the plugin of the node tagged tag and makes a connection
// of its own to it.
func (c *Client) dial(ctx context.Context, tag string) (*grpc.ClientConn, Peer, error) {
	p, err := c.res.Resolve(ctx, tag)
	if err != nil {
		code := codes.Unavailable
		if st, ok := status.FromError(err); ok {
			code = st.Code()
		}
		return nil, p, status.Errorf(code, "find the plugin of node tag %s: %v", tag, err)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(c.creds.ClientConfig(p.Node))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)),
		grpc.WithMaxHeaderListSize(maxHeaderList),
	}
	if c.tok != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(callCreds{c.tok}))
	}
	conn, err := grpc.NewClient("passthrough:///"+p.Addr, opts...)
	if err != nil {
		return nil, p, status.Errorf(codes.Unavailable, "plugin of node %s at %s: %v", p.Node, p.Addr, err)
	}
	return conn, p, nil
}

// unavailable names the peer in an Unavailable error; other errors are
// the peer's answer and come back as they are.
func (c *Client) unavailable(p Peer, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: %s", p.Node, p.Addr, st.Message())
	}
	return err
}

// call makes one call on a connection of its own: calls are rare (a
// resize, a change of class) and a fresh resolution and handshake each
// time means a restarted peer's new address and certificate are used at
// once. The call's deadline is ctx's and travels to the peer. The peer's
// answer comes back as it is; a peer that cannot be found or reached is
// Unavailable, which callers retry.
func (c *Client) call(ctx context.Context, tag, method string, req, resp any) error {
	conn, p, err := c.dial(ctx, tag)
	if err != nil {
		return err
	}
	defer conn.Close()
	var hdr metadata.MD
	if err := conn.Invoke(ctx, method, req, resp, grpc.Header(&hdr)); err != nil {
		return c.unavailable(p, err)
	}
	if c.tok != nil {
		return c.tok.checkServer(ctx, hdr, p)
	}
	return nil
}
