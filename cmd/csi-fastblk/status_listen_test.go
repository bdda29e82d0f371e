package main

import (
	"context"
	"github.com/fastblk/csi-fastblk/pkg/metrics"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/driver"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpCode(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestStatusStaysLocal proves that by default /status (volume names and
// paths) is served only on a socket beside the CSI socket, owner and group
// only, which `csi-fastblk status` reads, while the network-facing metrics
// address serves /metrics and /healthz alone; --expose-status adds /status
// there.
func TestStatusStaysLocal(t *testing.T) {
	status := func(context.Context) (driver.NodeStatus, error) {
		return driver.NodeStatus{Healthy: true, NodeID: "n1",
			Volumes: []driver.VolumeStatus{{ID: "v1", Name: "pvc-private", StagingPath: "/var/lib/kubelet/x"}}}, nil
	}
	for _, expose := range []bool{false, true} {
		dir := t.TempDir()
		cfg := &serveConfig{endpoint: "unix://" + filepath.Join(dir, "csi.sock"), metricsAddress: freeAddr(t), exposeStatus: expose}
		stop, err := startMetrics(cfg, status, metrics.Startup{})
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + cfg.metricsAddress
		if code := httpCode(t, base+"/metrics"); code != 200 {
			t.Errorf("GET /metrics = %d", code)
		}
		want := http.StatusNotFound
		if expose {
			want = http.StatusOK
		}
		if code := httpCode(t, base+"/status"); code != want {
			t.Errorf("expose-status %v: GET /status on the metrics address = %d, want %d", expose, code, want)
		}
		sock := filepath.Join(dir, statusSocket)
		st, _, err := fetchStatus(context.Background(), "unix://"+sock)
		if err != nil || st.NodeID != "n1" || len(st.Volumes) != 1 {
			t.Errorf("status from %s: %+v, %v", sock, st, err)
		}
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm()&0o007 != 0 {
			t.Errorf("status socket %v (%v): want no access for others", fi, err)
		}
		stop()
	}
}
