package peer

import (
	"context"
	"fmt"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// A peer's request reaches code that runs in the privileged plugin, on
// the server's goroutines and on goroutines of a stream's own: a panic in
// any of them ends that call or stream with Internal and is logged with
// its stack, and the plugin keeps serving its node's volumes.

// safely runs f and turns a panic in it into Internal; what and volumeID
// name it in the log and the error.
func safely(ctx context.Context, what, volumeID string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			caller, _ := Caller(ctx)
			klog.ErrorS(fmt.Errorf("panic: %v", r), "peer call panicked", "call", what, "volumeID", volumeID,
				"peer", caller.Node, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "%s of %q: internal error (panic: %v)", what, volumeID, r)
		}
	}()
	return f()
}

// recoverUnary is the server's outermost unary interceptor.
func recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	err = safely(ctx, info.FullMethod, volumeOf(req), func() (err error) {
		resp, err = handler(ctx, req)
		return err
	})
	return resp, err
}

// recoverStream is the server's outermost stream interceptor.
func recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return safely(ss.Context(), info.FullMethod, "", func() error { return handler(srv, ss) })
}

// volumeOf is the volume a request names (a handoff's: its name), for logs.
func volumeOf(req any) string {
	switch r := req.(type) {
	case interface{ GetVolumeId() string }:
		return r.GetVolumeId()
	case interface{ GetName() string }:
		return r.GetName()
	}
	return ""
}
