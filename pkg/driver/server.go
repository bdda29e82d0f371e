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
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// socketMode is the mode of the plugin's unix sockets: owner and group
// only, whatever the process umask. The CSI socket answers every caller
// with full power over the node's volumes; sidecars reach it as root or
// through a shared group.
const socketMode = 0o660

// Listen opens the endpoint: unix:///path/to.sock or tcp://host:port. A stale
// socket file left by an earlier process is replaced. A unix socket is
// bound under a temporary name, given socketMode and only then renamed into
// place, so that no client ever connects while it has the umask's mode.
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
		return listenUnix(path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	}
	return nil, fmt.Errorf("endpoint %q: scheme must be unix or tcp", endpoint)
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".tmp-%s-%d", filepath.Base(path), os.Getpid()))
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", tmp, err)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	lis.SetUnlinkOnClose(false) // it is renamed below; Close removes path
	if err := os.Chmod(tmp, socketMode); err != nil {
		return nil, errors.Join(fmt.Errorf("chmod socket %s: %w", tmp, err), lis.Close(), os.Remove(tmp))
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, errors.Join(fmt.Errorf("place socket %s: %w", path, err), lis.Close(), os.Remove(tmp))
	}
	return &unixListener{Listener: lis, path: path}, nil
}

// unixListener removes its socket file when closed.
type unixListener struct {
	net.Listener
	path string
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { os.Remove(l.path) })
	return err
}

// NewServer returns a gRPC server with Identity, Controller,
// GroupController, Node and SnapshotMetadata registered, and interceptors that log every call and
// turn panics into Internal errors.
func (d *Driver) NewServer() *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(logAndRecover), grpc.StreamInterceptor(logAndRecoverStream))
	csi.RegisterIdentityServer(srv, &Identity{d: d})
	csi.RegisterControllerServer(srv, &Controller{d: d})
	csi.RegisterGroupControllerServer(srv, &GroupController{d: d})
	csi.RegisterNodeServer(srv, &Node{d: d})
	d.registerSnapshotMetadata(srv)
	return srv
}

// logAndRecoverStream is logAndRecover for streaming calls (the
// SnapshotMetadata service): the request is not logged, the handler
// logs what it answers.
func logAndRecoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(nil, "panic in CSI call", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
		if err != nil {
			klog.V(2).InfoS("call failed", "method", info.FullMethod, "code", status.Code(err), "err", err, "duration", time.Since(start))
			return
		}
		klog.V(2).InfoS("call", "method", info.FullMethod, "duration", time.Since(start))
	}()
	return handler(srv, ss)
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
