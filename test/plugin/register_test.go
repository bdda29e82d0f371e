package plugin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// TestKubeletRegistration plays the kubelet against the binary serving its
// own registration (--registration-dir), as the chart runs it: the socket
// names the endpoint as the kubelet sees it, health (/healthz on
// --health-address, Probe) says "not registered" until the kubelet
// confirms, and a refusal makes the plugin exit non-zero (its container
// then restarts) and remove its socket.
func TestKubeletRegistration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices")
	}
	regDir := filepath.Join(t.TempDir(), "plugins_registry")
	if err := os.Mkdir(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(regDir, "fastblk.csi.io-reg.sock")
	// A socket left by a killed plugin: replaced, not an obstacle.
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	health := freePort(t)
	p := launchArgs(t, buildBinary(t), t.TempDir(), []string{"--registration-dir", regDir,
		"--kubelet-registration-path", "/var/lib/kubelet/plugins/fastblk.csi.io/csi.sock", "--health-address", health})
	healthz := func() (int, string) {
		resp, err := http.Get("http://" + health + "/healthz")
		if err != nil {
			t.Fatalf("GET /healthz: %v", err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}

	ctx := context.Background()
	waitFor(t, "registration socket", func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	k := registerapi.NewRegistrationClient(conn)
	info, err := k.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "fastblk.csi.io" || info.Endpoint != "/var/lib/kubelet/plugins/fastblk.csi.io/csi.sock" {
		t.Errorf("GetInfo = %v", info)
	}
	if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("/healthz before the kubelet confirmed = %d %q, want 503 saying not registered", code, body)
	}
	probe, err := csi.NewIdentityClient(p.conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil || probe.GetReady().GetValue() {
		t.Errorf("Probe before the kubelet confirmed = %v, %v; want not ready", probe, err)
	}

	if _, err := k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if code, body := healthz(); code != http.StatusOK {
		t.Errorf("/healthz once registered = %d %q", code, body)
	}

	// The kubelet retries a failed registration by a new socket: refused,
	// the plugin exits non-zero and leaves no socket behind.
	if _, err := k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false,
		Error: "driver name already registered by another endpoint"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("plugin exit after a refused registration: %v, want a non-zero status", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("plugin still running 30 s after the kubelet refused its registration")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registration socket left after exit: %v", err)
	}
	log, _ := os.ReadFile(filepath.Join(p.dir, "plugin.log"))
	if !strings.Contains(string(log), "driver name already registered by another endpoint") {
		t.Errorf("the plugin's log does not give the kubelet's reason:\n%s", log)
	}
}
