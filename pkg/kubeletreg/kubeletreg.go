package kubeletreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// csiVersions are the versions of the kubelet's CSI plugin interface the
// plugin supports, as GetInfo reports them (the kubelet takes the highest
// 1.x).
var csiVersions = []string{"1.0.0"}

// ErrNotRegistered is the health of a plugin the kubelet has not confirmed
// yet, or whose registration socket is gone (the kubelet then dropped it).
// Its text, and that of the errors wrapping it, names no path: it is
// served on the network (/healthz).
var ErrNotRegistered = errors.New("not registered")

// Config says what to register and where.
type Config struct {
	// Dir is the kubelet's plugin registration directory.
	Dir string
	// DriverName is the CSI driver name; the socket is <DriverName>-reg.sock.
	DriverName string
	// Endpoint is the path of the plugin's CSI socket as the kubelet sees
	// it (on the node, not in the plugin's container).
	Endpoint string
}

// SocketPath is the registration socket's path.
func (c Config) SocketPath() string { return filepath.Join(c.Dir, c.DriverName+"-reg.sock") }

// Server answers the kubelet's registration calls. Create it with New.
type Server struct {
	registerapi.UnimplementedRegistrationServer
	cfg Config

	mu         sync.Mutex
	registered bool
	sock       os.FileInfo // the socket Run created, to tell it from a successor's
	refused    chan string // kubelet's error on a refusal; buffered, sent once
	refuseOnce sync.Once
}

// New validates cfg and returns a Server; Run serves it.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" || cfg.DriverName == "" || cfg.Endpoint == "" {
		return nil, fmt.Errorf("kubelet registration: directory, driver name and endpoint are required (have %+v)", cfg)
	}
	return &Server{cfg: cfg, refused: make(chan string, 1)}, nil
}

// GetInfo answers the kubelet's first call: a CSI plugin, its name and its
// CSI endpoint.
func (s *Server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.cfg.DriverName,
		Endpoint:          s.cfg.Endpoint,
		SupportedVersions: csiVersions,
	}, nil
}

// NotifyRegistrationStatus records the kubelet's verdict. A refusal makes
// Run return (after this answer is sent).
func (s *Server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.mu.Lock()
	s.registered = st.PluginRegistered
	s.mu.Unlock()
	if !st.PluginRegistered {
		s.refuseOnce.Do(func() { s.refused <- st.Error })
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Healthy returns nil once the kubelet confirmed the registration and while
// the registration socket Run made is still in place; otherwise an error
// wrapping ErrNotRegistered. A socket removed from under the plugin (by an
// operator or a cleanup) means the kubelet dropped the plugin, and nothing
// but a new socket registers it again: the plugin is not healthy.
func (s *Server) Healthy(context.Context) error {
	s.mu.Lock()
	registered, sock := s.registered, s.sock
	s.mu.Unlock()
	if !registered {
		return ErrNotRegistered
	}
	fi, err := os.Lstat(s.cfg.SocketPath())
	if err != nil || !os.SameFile(fi, sock) {
		return fmt.Errorf("%w (the registration socket was removed)", ErrNotRegistered)
	}
	return nil
}

// RefusedError is Run's error when the kubelet refused the registration.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "kubelet refused the registration: " + e.Reason }

// Run serves the registration socket until ctx is done (it returns nil) or
// the kubelet refuses the registration (a *RefusedError). It replaces a
// stale socket at start and removes its socket before it returns.
func (s *Server) Run(ctx context.Context) error {
	lis, err := s.listen()
	if err != nil {
		return err
	}
	path := s.cfg.SocketPath()
	defer func() {
		// Only our own socket: a successor may have placed its own.
		if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, s.sock) {
			os.Remove(path)
		}
	}()
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, s)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("kubelet registration: serve %s: %w", path, err)
	case reason := <-s.refused:
		srv.GracefulStop()
		<-errc
		return &RefusedError{Reason: reason}
	case <-ctx.Done():
		srv.GracefulStop()
		<-errc
		return nil
	}
}

// listen binds the socket under a hidden temporary name (the kubelet skips
// dot files), gives it mode 0600 and renames it over whatever is at the
// path, a stale socket included, so that the kubelet never sees a
// half-made socket.
func (s *Server) listen() (net.Listener, error) {
	path := s.cfg.SocketPath()
	tmp := filepath.Join(s.cfg.Dir, fmt.Sprintf(".%s-reg.sock.%d", s.cfg.DriverName, os.Getpid()))
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("kubelet registration: remove %s: %w", tmp, err)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("kubelet registration: %w", err)
	}
	lis.SetUnlinkOnClose(false) // Run removes the renamed socket
	fail := func(err error) (net.Listener, error) {
		return nil, errors.Join(fmt.Errorf("kubelet registration: %w", err), lis.Close(), os.Remove(tmp))
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	s.sock = fi
	s.mu.Unlock()
	return lis, nil
}
