package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Listen opens the endpoint: unix:///path/to.sock or tcp://host:port. A stale
// socket file left by an earlier process is removed first.
func Listen(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("parse endpoint %q: %w", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if u.Host != "" {
			path = filepath.Join(u.Host, u.Path)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("create socket directory: %w", err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
		return net.Listen("unix", path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	}
	return nil, fmt.Errorf("endpoint %q: scheme must be unix or tcp", endpoint)
}

// NewServer returns a gRPC server with Identity, Controller and Node
// registered, and an interceptor that logs every call and turns panics into
// Internal errors.
func (d *Driver) NewServer() *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(logAndRecover))
	csi.RegisterIdentityServer(srv, &Identity{d: d})
	csi.RegisterControllerServer(srv, &Controller{d: d})
	csi.RegisterNodeServer(srv, &Node{d: d})
	return srv
}

// Serve serves on lis until ctx is done, then stops gracefully (in-flight
// calls finish; new ones are refused).
func (d *Driver) Serve(ctx context.Context, lis net.Listener) error {
	srv := d.NewServer()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			srv.Stop()
		}
		return nil
	}
}

func logAndRecover(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(nil, "panic in CSI call", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
		level := klog.Level(2)
		if info.FullMethod == "/csi.v1.Identity/Probe" {
			level = 6
		}
		if err != nil {
			klog.V(level).InfoS("call failed", "method", info.FullMethod, "request", protosanitizer.StripSecrets(req),
				"code", status.Code(err), "err", err, "duration", time.Since(start))
			return
		}
		klog.V(level).InfoS("call", "method", info.FullMethod, "request", protosanitizer.StripSecrets(req),
			"duration", time.Since(start))
	}()
	return handler(ctx, req)
}
