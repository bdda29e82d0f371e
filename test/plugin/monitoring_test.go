package plugin

import (
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	dto "github.com/prometheus/client_model/go"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
	"github.com/fastblk/csi-fastblk/test/internal/monitoring"
)

// TestMonitoringNamesExportedMetrics checks that every query of the chart's
// Grafana dashboard and every alert of its PrometheusRule reads only metrics
// the plugin serves: the real binary, with volumes in use and I/O done, is
// scraped, and the names in each expression are matched with the families
// of its /metrics (the families a loop-backed plugin without a pids limit
// cannot show, monitoring.Conditional, are checked on a ublk plugin by
// test/e2e in the VM). Alerts
// may also read Prometheus' own up series. The plugin runs with --backend
// auto, which on this machine (no ublk) falls back to loop, and with a
// device class whose path is missing, so that the families of a fallback
// and of an unavailable class are served too.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	p := launchArgs(t, buildBinary(t), dir, []string{"--backend", "auto", "--device-class=name=gone,path=" + filepath.Join(dir, "gone")})
	capBlock := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	for _, name := range []string{"mon-a", "mon-b"} {
		id, staging, target := p.provisionAt(t, name, 16<<20, capBlock, filepath.Join(p.dir, "staging-"+name), name,
			map[string]string{"csi.storage.k8s.io/pvc/name": name, "csi.storage.k8s.io/pvc/namespace": "apps",
				"csi.storage.k8s.io/pv/name": name})
		t.Cleanup(func() { p.release(t, id, staging, target) })
		f, err := os.OpenFile(target, os.O_RDWR|syscall.O_SYNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, 64<<10), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	_, body := p.get(t, "/metrics")
	fams, err := monitoring.Families(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ublk.HaveUblk(); err == nil {
		// A machine with ublk does not fall back: the family is served
		// by the nodes that do (test/k8s TestBackendInPlainSight).
		fams["fastblk_backend_fallback"] = dto.MetricType_GAUGE
	}
	chart := filepath.Join("..", "..", "charts", "csi-fastblk")
	dash, err := monitoring.DashboardQueries(filepath.Join(chart, "dashboards", "csi-fastblk.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := monitoring.RuleExprs(filepath.Join(chart, "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dash) < 10 || len(rules) < 5 {
		t.Fatalf("%d dashboard queries and %d alerts read: the files changed shape", len(dash), len(rules))
	}
	used := map[string]bool{}
	check := func(q monitoring.Query, alert bool) {
		names := monitoring.MetricNames(q.Expr)
		if len(names) == 0 && !strings.HasPrefix(q.Where, "variable") {
			t.Errorf("%s: no metric in %q", q.Where, q.Expr)
		}
		for _, n := range names {
			if n == "up" && alert {
				continue
			}
			fam, ok := monitoring.Family(n, fams)
			if !ok {
				t.Errorf("%s: %s is not a metric the plugin serves (query %q)", q.Where, n, q.Expr)
			}
			used[fam] = true
		}
	}
	for _, q := range dash {
		check(q, false)
	}
	for _, q := range rules {
		check(q, true)
	}
	// What the dashboard is for: per-volume I/O, latency, throttling,
	// device state and node capacity.
	for _, want := range []string{"fastblk_volume_ios_total", "fastblk_volume_bytes_total", "fastblk_volume_io_latency_seconds",
		"fastblk_volume_throttled_ios_total", "fastblk_volume_device_state", "fastblk_node_capacity_available_bytes",
		"fastblk_node_filesystem_free_bytes", "fastblk_volume_allocated_bytes"} {
		if !used[want] {
			t.Errorf("no dashboard query or alert reads %s", want)
		}
	}
	t.Logf("%d dashboard queries and %d alerts read %d metrics; the plugin served %d families", len(dash), len(rules), len(used), len(fams))
}
