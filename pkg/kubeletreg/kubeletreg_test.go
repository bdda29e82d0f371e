package kubeletreg

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// run is a Server's Run in a goroutine.
type run struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// wait returns Run's result.
func (r *run) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// start runs a Server on a fresh registration directory and waits until
// its socket answers.
func start(t *testing.T, prepare func(cfg Config)) (*Server, Config, *run) {
	t.Helper()
	cfg := Config{Dir: t.TempDir(), DriverName: "fastblk.csi.io", Endpoint: "/var/lib/kubelet/plugins/fastblk.csi.io/csi.sock"}
	if prepare != nil {
		prepare(cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{cancel: cancel, done: make(chan struct{})}
	go func() { r.err = s.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); r.wait(t) })
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", cfg.SocketPath()); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s never answered", cfg.SocketPath())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s, cfg, r
}

// kubelet is a client of the registration socket, as the kubelet's plugin
// manager is.
func kubelet(t *testing.T, cfg Config) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+cfg.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

func TestGetInfoNamesTheEndpointAsKubeletSeesIt(t *testing.T) {
	_, cfg, _ := start(t, nil)
	info, err := kubelet(t, cfg).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != cfg.DriverName || info.Endpoint != cfg.Endpoint {
		t.Errorf("GetInfo = type %q name %q endpoint %q, want %q %q %q",
			info.Type, info.Name, info.Endpoint, registerapi.CSIPlugin, cfg.DriverName, cfg.Endpoint)
	}
	if len(info.SupportedVersions) == 0 {
		t.Error("GetInfo lists no supported version")
	}
	if filepath.Base(cfg.SocketPath()) != "fastblk.csi.io-reg.sock" {
		t.Errorf("socket %s, want <driver>-reg.sock", cfg.SocketPath())
	}
	fi, err := os.Stat(cfg.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with mode 0600", fi.Mode())
	}
}

func TestStaleSocketReplacedAtStart(t *testing.T) {
	for _, stale := range []string{"socket", "file"} {
		t.Run(stale, func(t *testing.T) {
			_, cfg, _ := start(t, func(cfg Config) {
				path := cfg.SocketPath()
				if stale == "file" {
					if err := os.WriteFile(path, nil, 0o600); err != nil {
						t.Fatal(err)
					}
					return
				}
				// A socket nobody listens on, as a killed plugin leaves it.
				lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				lis.SetUnlinkOnClose(false)
				lis.Close()
			})
			if _, err := kubelet(t, cfg).GetInfo(context.Background(), &registerapi.InfoRequest{}); err != nil {
				t.Fatalf("GetInfo on the replaced socket: %v", err)
			}
		})
	}
}

func TestSocketRemovedAtExit(t *testing.T) {
	_, cfg, r := start(t, nil)
	r.cancel()
	if err := r.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if _, err := os.Lstat(cfg.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after exit: %v", err)
	}
	if left, _ := os.ReadDir(cfg.Dir); len(left) != 0 {
		t.Errorf("registration directory not empty after exit: %v", left)
	}
}

func TestRefusalEndsRun(t *testing.T) {
	_, cfg, r := start(t, nil)
	_, err := kubelet(t, cfg).NotifyRegistrationStatus(context.Background(),
		&registerapi.RegistrationStatus{PluginRegistered: false, Error: "plugin is not a CSI driver"})
	if err != nil {
		t.Fatalf("NotifyRegistrationStatus(false) was not answered: %v", err)
	}
	err = r.wait(t)
	if r, ok := errors.AsType[*RefusedError](err); !ok || r.Reason != "plugin is not a CSI driver" {
		t.Fatalf("Run after a refusal = %v, want a RefusedError with the kubelet's reason", err)
	}
	if _, err := os.Lstat(cfg.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after a refusal: %v", err)
	}
}

func TestHealthyOnlyOnceRegistered(t *testing.T) {
	s, cfg, _ := start(t, nil)
	ctx := context.Background()
	if err := s.Healthy(ctx); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Healthy before the kubelet confirmed = %v, want ErrNotRegistered", err)
	}
	k := kubelet(t, cfg)
	if _, err := k.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(ctx); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Healthy after GetInfo alone = %v, want ErrNotRegistered", err)
	}
	if _, err := k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(ctx); err != nil {
		t.Fatalf("Healthy after the kubelet confirmed = %v", err)
	}

	// The socket removed from under the plugin: the kubelet drops the
	// plugin, so it is no longer registered.
	if err := os.Remove(cfg.SocketPath()); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(ctx); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Healthy with the socket gone = %v, want ErrNotRegistered", err)
	}
	// Another socket at the path (a second plugin's) is not ours either.
	lis, err := net.Listen("unix", cfg.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if err := s.Healthy(ctx); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Healthy with another socket at the path = %v, want ErrNotRegistered", err)
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	for _, cfg := range []Config{
		{DriverName: "d", Endpoint: "/e"},
		{Dir: "/r", Endpoint: "/e"},
		{Dir: "/r", DriverName: "d"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted an incomplete config", cfg)
		}
	}
}
