package peer

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MetadataHandler is a Handler that also answers the CSI SnapshotMetadata
// calls another node forwards for a snapshot of this node: the
// csi-snapshot-metadata sidecar of the cluster's one address reached the
// plugin of some node, and that plugin holds only its own snapshots. Found
// by type assertion: a Handler without it refuses them (Unimplemented).
// The requests carry no secrets (the client strips them) and the answers
// go back to the caller message by message, in order.
type MetadataHandler interface {
	GetMetadataAllocated(*csi.GetMetadataAllocatedRequest, csi.SnapshotMetadata_GetMetadataAllocatedServer) error
	GetMetadataDelta(*csi.GetMetadataDeltaRequest, csi.SnapshotMetadata_GetMetadataDeltaServer) error
}

// The SnapshotMetadata calls travel as their own service on the peer
// server, with the CSI spec's messages and gRPC's protobuf codec.
const (
	metadataService   = "fastblk.peer.v1.SnapshotMetadata"
	methodAllocated   = "/" + metadataService + "/GetMetadataAllocated"
	methodDelta       = "/" + metadataService + "/GetMetadataDelta"
	maxMetadataAnswer = 4 << 20 // one streamed answer: gRPC's default bound
)

// MetadataDeadline bounds a forwarded SnapshotMetadata stream on the
// serving node: the csi-snapshot-metadata sidecar ends its own streams
// after 10 minutes by default (--max-streaming-duration-min), and a caller
// gone without a word must not hold a stream for longer.
const MetadataDeadline = 15 * time.Minute

// metadataDesc is registered on every peer server, whatever its Handler
// (so HandlerType is any): a Handler that is no MetadataHandler answers
// Unimplemented.
var metadataDesc = grpc.ServiceDesc{
	ServiceName: metadataService,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "GetMetadataAllocated", ServerStreams: true, Handler: metadataStream(
			func(h MetadataHandler, req *csi.GetMetadataAllocatedRequest, ss grpc.ServerStream) error {
				return h.GetMetadataAllocated(req, &grpc.GenericServerStream[csi.GetMetadataAllocatedRequest, csi.GetMetadataAllocatedResponse]{ServerStream: ss})
			})},
		{StreamName: "GetMetadataDelta", ServerStreams: true, Handler: metadataStream(
			func(h MetadataHandler, req *csi.GetMetadataDeltaRequest, ss grpc.ServerStream) error {
				return h.GetMetadataDelta(req, &grpc.GenericServerStream[csi.GetMetadataDeltaRequest, csi.GetMetadataDeltaResponse]{ServerStream: ss})
			})},
	},
	Metadata: "fastblk/peer",
}

// metadataStream adapts a MetadataHandler method to grpc's stream
// handler: the call takes a place among the node's streams (Limits, as a
// data stream does), reads its one request and runs within
// MetadataDeadline.
func metadataStream[Req any](call func(MetadataHandler, *Req, grpc.ServerStream) error) grpc.StreamHandler {
	return func(srv any, ss grpc.ServerStream) error {
		svc := srv.(*service)
		h, ok := svc.Handler.(MetadataHandler)
		if !ok {
			return status.Error(codes.Unimplemented, "this node's plugin offers no snapshot metadata")
		}
		caller, _ := Caller(ss.Context())
		release, err := svc.streams.admit(caller.Node)
		if err != nil {
			return err
		}
		defer release()
		req := new(Req)
		if err := ss.RecvMsg(req); err != nil {
			return status.Errorf(codes.InvalidArgument, "snapshot metadata request: %v", err)
		}
		ctx, cancel := context.WithTimeout(ss.Context(), MetadataDeadline)
		defer cancel()
		return call(h, req, ctxStream{ServerStream: ss, ctx: ctx})
	}
}

// ctxStream is a server stream whose context is bounded.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// GetMetadataAllocated asks the plugin of the node tagged tag for the
// allocated blocks of one of its snapshots and passes each message of the
// answer to send, in order, until the answer ends (nil), send fails (its
// error), or the peer fails (its status; Unavailable names the peer).
// Secrets stay here.
func (c *Client) GetMetadataAllocated(ctx context.Context, tag string, req *csi.GetMetadataAllocatedRequest, send func(*csi.GetMetadataAllocatedResponse) error) error {
	r := proto.Clone(req).(*csi.GetMetadataAllocatedRequest)
	r.Secrets = nil
	return relay(ctx, c, tag, methodAllocated, r, send)
}

// GetMetadataDelta is GetMetadataAllocated for the blocks changed between
// two snapshots of the node tagged tag.
func (c *Client) GetMetadataDelta(ctx context.Context, tag string, req *csi.GetMetadataDeltaRequest, send func(*csi.GetMetadataDeltaResponse) error) error {
	r := proto.Clone(req).(*csi.GetMetadataDeltaRequest)
	r.Secrets = nil
	return relay(ctx, c, tag, methodDelta, r, send)
}

// relay opens a server stream of method on a connection of its own to the
// node tagged tag, sends req and hands every answer to send.
func relay[Resp any](ctx context.Context, c *Client, tag, method string, req proto.Message, send func(*Resp) error) error {
	conn, p, err := c.dial(ctx, tag)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// No answer is taken before the server proved itself the plugin of
	// p's node, as for ReadData.
	st, err, proofErr := c.openStream(ctx, conn, p, &grpc.StreamDesc{ServerStreams: true}, method, req, new(Resp),
		grpc.MaxCallRecvMsgSize(maxMetadataAnswer))
	if proofErr != nil {
		return proofErr
	}
	if err != nil {
		return c.unavailable(p, err)
	}
	for {
		m := new(Resp)
		err := st.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return c.unavailable(p, err)
		}
		if err := send(m); err != nil {
			return err
		}
	}
}
