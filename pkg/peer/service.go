package peer

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
)

// Handler does on this node what a peer asks. Its methods get requests
// from other plugins (already authenticated, never from outside the
// installation; Caller says which node) and must validate them as they
// validate the CSI socket's, and authorize them: a peer names objects by
// ID only, and may be a stolen node.
type Handler interface {
	ModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error)
	ExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	// CreateVolume makes on this node a volume from a source of this
	// node, handed off by the node the provisioner asked.
	CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	// OpenSource opens for reading what a ReadData stream sends: a
	// snapshot as it is, or a point-in-time copy of a volume that
	// takes no name (unlinked) and goes when the file is closed; and
	// returns its size. The stream closes the file.
	OpenSource(ctx context.Context, req *ReadRequest) (f *os.File, size int64, err error)
}

// SourceFinisher is a Handler told how each stream of a source it opened
// ended, after the stream closed the file: err is nil when the whole
// source was sent. A Handler that keeps what it opened for a retry (the
// copy of a volume) lets it go, or keeps it a while, by this.
type SourceFinisher interface {
	SourceSent(ctx context.Context, req *ReadRequest, err error)
}

// The service is written out by hand (no generated stubs): the unary
// calls' messages are the CSI spec's own; the data stream's are in
// frame.go.
const (
	serviceName    = "fastblk.peer.v1.Peer"
	methodModify   = "/" + serviceName + "/ModifyVolume"
	methodExpand   = "/" + serviceName + "/ExpandVolume"
	methodCreate   = "/" + serviceName + "/CreateVolume"
	methodReadData = "/" + serviceName + "/ReadData"
)

// maxMessage bounds every message of the unary calls, and the request of
// a stream: a CSI request of an ID, a capacity and a few parameters is
// far smaller. A stream's frames have their own bound (maxFrame), which
// the client sets on the stream alone.
const maxMessage = 64 << 10

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*Handler)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "ModifyVolume", Handler: unary(methodModify, Handler.ModifyVolume)},
		{MethodName: "ExpandVolume", Handler: unary(methodExpand, Handler.ExpandVolume)},
		{MethodName: "CreateVolume", Handler: unary(methodCreate, Handler.CreateVolume)},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "ReadData", Handler: readData, ServerStreams: true},
	},
	Metadata: "fastblk/peer",
}

// unary adapts a Handler method to grpc's method handler.
func unary[Req any, Resp any](method string, call func(Handler, context.Context, *Req) (*Resp, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		h := srv.(Handler)
		if icpt == nil {
			return call(h, ctx, req)
		}
		return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method},
			func(ctx context.Context, req any) (any, error) { return call(h, ctx, req.(*Req)) })
	}
}

// Server serves the peer service over mutual TLS.
type Server struct {
	srv *grpc.Server
	svc *service
}

// service is what the server registers: the Handler, and the count of
// its data streams within the limits.
type service struct {
	Handler
	lim     Limits
	streams streamCounts
}

// NewServer returns a server of h with creds within lim; interceptors
// (logging) run around every unary call.
func NewServer(creds *Credentials, h Handler, lim Limits, interceptors ...grpc.UnaryServerInterceptor) *Server {
	return NewServerWith(creds, h, lim, grpc.ChainUnaryInterceptor(interceptors...))
}

// NewServerWith returns a server of h with creds within lim and further
// options (interceptors of streams, say). A panic in a call, a stream or
// a stream's goroutines ends that call or stream with Internal, never the
// plugin.
func NewServerWith(creds *Credentials, h Handler, lim Limits, opts ...grpc.ServerOption) *Server {
	lim = lim.withDefaults()
	svc := &service{Handler: h, lim: lim, streams: streamCounts{lim: lim}}
	base := append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(creds.ServerConfig())),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.ChainUnaryInterceptor(recoverUnary),
		grpc.ChainStreamInterceptor(recoverStream),
	}, grpcLimits()...)
	srv := grpc.NewServer(append(base, opts...)...)
	srv.RegisterService(&serviceDesc, svc)
	srv.RegisterService(&metadataDesc, svc)
	return &Server{srv: srv, svc: svc}
}

// stopGrace is how long a stopping server lets calls and streams end.
const stopGrace = 5 * time.Second

// Serve serves on lis until ctx ends, then stops gracefully (cutting
// streams still running after stopGrace); it returns what ended it (nil
// after ctx).
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			// Unary calls end in moments; a stream of a volume's
			// data may not, and its receiver starts it again.
			t := time.AfterFunc(stopGrace, s.srv.Stop)
			defer t.Stop()
			s.srv.GracefulStop()
		case <-done:
		}
	}()
	err := s.srv.Serve(limitConns(lis, s.svc.lim.MaxConnsPerAddr))
	if ctx.Err() != nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Streams is the number of data streams the server sends.
func (s *Server) Streams() int { return s.svc.streams.active() }

// Stop stops the server at once, cutting every call and stream.
func (s *Server) Stop() { s.srv.Stop() }

// Caller is the identity of the peer that made the call in ctx: the one
// its token proved, on a server with Tokens; else its certificate's.
func Caller(ctx context.Context) (Identity, bool) {
	if id, ok := ctx.Value(callerKey{}).(Identity); ok {
		return id, true
	}
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return Identity{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(info.State.PeerCertificates[0])
	return id, err == nil
}
