package peer

import (
	"context"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Tokens are a plugin's side of the peers' token authentication
// (token.go): its own token, the node it is on, and the check of its
// peers' tokens. With Tokens, a server serves only calls whose token is
// of the plugin pod of the node they claim, and a client takes only
// answers from the plugin pod of the node it meant.
type Tokens struct {
	Self func() (string, error) // this plugin's projected token, read afresh (TokenFile)
	Node string                 // the node this plugin runs on
	Auth *Authenticator
}

// callerKey holds in a call's context the identity its token proved.
type callerKey struct{}

// ServerOptions are the interceptors that authenticate every call and
// stream before it runs, and send the server's own token in its headers.
func (t *Tokens) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(t.unary), grpc.ChainStreamInterceptor(t.stream)}
}

func (t *Tokens) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, own, err := t.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := grpc.SendHeader(ctx, own); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (t *Tokens) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, own, err := t.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	if err := ss.SendHeader(own); err != nil {
		return err
	}
	return handler(srv, authedStream{ss, ctx})
}

// authedStream is a stream whose context knows its caller.
type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s authedStream) Context() context.Context { return s.ctx }

// controllerCalls are the calls of the controller (the external-resizer's
// ControllerModifyVolume and ControllerExpandVolume, forwarded to the
// volume's node). With a controller account set (Authenticator.Controller)
// only the controller's pod makes them, and it makes no other.
var controllerCalls = map[string]bool{methodModify: true, methodExpand: true}

// authenticate checks the caller's token against the node it claims and
// the address it calls from, and that its account may make the call
// method, and returns the context with its identity and the headers that
// prove this server's.
func (t *Tokens) authenticate(ctx context.Context, method string) (context.Context, metadata.MD, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token, _ := strings.CutPrefix(first(md, mdAuthorization), "Bearer ")
	node := first(md, mdNode)
	var from net.IP
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok {
			from = a.IP
		}
	}
	if from == nil {
		return nil, nil, status.Error(codes.PermissionDenied, "peer call: not over TCP, so its address cannot be checked")
	}
	id, err := t.Auth.Verify(ctx, token, node, from)
	if err != nil {
		return nil, nil, status.Errorf(authCode(err), "peer call from %s as node %q: %v", from, node, err)
	}
	if c := t.Auth.Controller; c != "" && (id.ServiceAccount == c) != controllerCalls[method] {
		if id.ServiceAccount == c {
			return nil, nil, status.Errorf(codes.PermissionDenied, "peer call %s from the controller (%s): it may only change and grow volumes", method, id)
		}
		return nil, nil, status.Errorf(codes.PermissionDenied, "peer call %s from %s: only the controller changes and grows volumes", method, id)
	}
	own, err := t.Self()
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "peer call: %v", err)
	}
	return context.WithValue(ctx, callerKey{}, id), metadata.Pairs(mdServerToken, own, mdNode, t.Node), nil
}

// checkServer checks the headers of p's answer: the token of the plugin
// pod of p's node, at the address the client dialed. An answer without
// them is not p's, and is not taken.
func (t *Tokens) checkServer(ctx context.Context, hdr metadata.MD, p Peer) error {
	host, _, err := net.SplitHostPort(p.Addr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: not an IP address", p.Node, p.Addr)
	}
	if n := first(hdr, mdNode); n != p.Node {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: it answers for node %q", p.Node, p.Addr, n)
	}
	id, err := t.Auth.Verify(ctx, first(hdr, mdServerToken), p.Node, ip)
	if err == nil && id.ServiceAccount != t.Auth.ServiceAccount {
		err = fmt.Errorf("%w: the token is of %s, not of the plugin's service account", ErrNotThatPlugin, id.ServiceAccount)
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "plugin of node %s at %s: its answer is not taken: %v", p.Node, p.Addr, err)
	}
	return nil
}

// callCreds sends the client's token and node with every call.
type callCreds struct{ t *Tokens }

func (c callCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := c.t.Self()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	return map[string]string{mdAuthorization: "Bearer " + token, mdNode: c.t.Node}, nil
}

func (callCreds) RequireTransportSecurity() bool { return true }

// first is the first value of key in md, or "".
func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
