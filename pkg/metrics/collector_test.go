package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

func fixedStatus(st driver.NodeStatus) StatusFunc {
	return func(context.Context) (driver.NodeStatus, error) { return st, nil }
}

var headroom = int64(180)

var attached = driver.NodeStatus{
	Version: "v9.9.9", Backend: "ublk", Kernel: "6.12", Healthy: true, PidsHeadroom: &headroom,
	Classes: []driver.ClassStatus{
		{Name: "default", Path: "/data", CapacityAvailable: 100, CapacityTotal: 200, FilesystemFree: 150, Volumes: 1},
		{Name: "fast", Path: "/mnt/fast", CapacityAvailable: 300, CapacityTotal: 400, FilesystemFree: 350, Volumes: 1, Snapshots: 2},
		{Name: "old", Path: "/mnt/old", Unavailable: true, Error: "removed", Stranded: []string{"v8.old.n1", "v9.old.n1"}},
	},
	Quarantined: []string{"/data/meta/v3.json.corrupt-20261202T003000.000000000Z"},
	Volumes: []driver.VolumeStatus{
		{ID: "v1", Name: "pvc-1", Class: "default", PVCNamespace: "apps", PVCName: "data", PVName: "pvc-1", SizeBytes: 1 << 30, AllocatedBytes: 4096, Device: "/dev/ublkb0", Backend: "ublk",
			Tuning: blockdev.Tuning{Queues: 2, QueueDepth: 128, MaxIOBytes: 512 << 10},
			Disk:   &blkdev.Stats{ReadIOs: 10, ReadSectors: 80, WriteIOs: 5, WriteSectors: 40, InFlight: 3},
			Limits: qos.Limits{IOPS: 5000},
			IO: &blockdev.IOStats{State: "live", Recoveries: 1, Errors: 2, LatencyBounds: []float64{0.001, 0.01},
				LatencyCounts: []uint64{4, 15}, LatencySum: 0.05, LatencyCount: 15, Throttled: 7, ThrottledSeconds: 0.25}},
		{ID: "v2", Name: "pvc-2", Class: "fast", SizeBytes: 1 << 20, Limits: qos.Limits{BytesPerSecond: 100 << 20}},
	},
	Pulls: []driver.PullStatus{{VolumeID: "v3", Name: "pvc-3", PVCNamespace: "apps", PVCName: "restored", Source: "s1-n1", SourceNode: "n1",
		SizeBytes: 1 << 30, ExpectedBytes: 512 << 20, ReceivedBytes: 4096}},
	CopyPacing: copypace.Status{Copies: 2, Bounded: true, AllowedBytesPerSecond: 30 << 20, Cost: 0.25, Device: "/dev/ublkb0", Pauses: 9},
}

// TestCollectorReportsVolumes checks every per-volume family is derived
// from the status, and that a detached volume reports only its size.
func TestCollectorReportsVolumes(t *testing.T) {
	c := NewCollector(fixedStatus(attached), Startup{})
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}
	for _, tc := range []struct {
		metric string
		want   string
	}{
		{"fastblk_volume_ios_total", `fastblk_volume_ios_total{device_class="default",name="pvc-1",namespace="apps",op="read",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 10`},
		{"fastblk_volume_bytes_total", `fastblk_volume_bytes_total{device_class="default",name="pvc-1",namespace="apps",op="write",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 20480`},
		{"fastblk_volume_in_flight_ios", `fastblk_volume_in_flight_ios{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 3`},
		{"fastblk_volume_queue_depth", `fastblk_volume_queue_depth{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 128`},
		{"fastblk_volume_max_io_bytes", `fastblk_volume_max_io_bytes{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 524288`},
		{"fastblk_volume_recoveries_total", `fastblk_volume_recoveries_total{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 1`},
		{"fastblk_volume_io_latency_seconds", `fastblk_volume_io_latency_seconds_bucket{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1",le="0.01"} 15`},
		{"fastblk_volume_device_state", `fastblk_volume_device_state{backend="ublk",device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",state="live",volume_id="v1"} 1`},
		{"fastblk_volume_size_bytes", `fastblk_volume_size_bytes{device_class="fast",name="pvc-2",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="v2"} 1.048576e+06`},
		{"fastblk_volume_allocated_bytes", `fastblk_volume_allocated_bytes{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 4096`},
		{"fastblk_pull_received_bytes", `fastblk_pull_received_bytes{name="pvc-3",namespace="apps",persistentvolumeclaim="restored",source="s1-n1",source_node="n1",volume_id="v3"} 4096`},
		{"fastblk_pull_expected_bytes", `fastblk_pull_expected_bytes{name="pvc-3",namespace="apps",persistentvolumeclaim="restored",source="s1-n1",source_node="n1",volume_id="v3"} 5.36870912e+08`},
		{"fastblk_copy_pacing_copies", "fastblk_copy_pacing_copies 2\n"},
		{"fastblk_copy_pacing_allowed_bytes_per_second", "fastblk_copy_pacing_allowed_bytes_per_second 3.145728e+07\n"},
		{"fastblk_copy_pacing_cost", "fastblk_copy_pacing_cost 0.25\n"},
		{"fastblk_copy_pacing_pauses_total", "fastblk_copy_pacing_pauses_total 9\n"},
		{"fastblk_node_capacity_available_bytes", `fastblk_node_capacity_available_bytes{device_class="default"} 100`},
		{"fastblk_node_capacity_total_bytes", `fastblk_node_capacity_total_bytes{device_class="fast"} 400`},
		{"fastblk_node_filesystem_free_bytes", `fastblk_node_filesystem_free_bytes{device_class="fast"} 350`},
		{"fastblk_snapshots", `fastblk_snapshots{device_class="fast"} 2`},
		{"fastblk_device_class_unavailable", `fastblk_device_class_unavailable{device_class="old",path="/mnt/old"} 1`},
		{"fastblk_device_class_stranded_volumes", `fastblk_device_class_stranded_volumes{device_class="old"} 2`},
		{"fastblk_healthy", "fastblk_healthy 1\n"},
		{"fastblk_build_info", `fastblk_build_info{backend="ublk",goversion="` + runtime.Version() + `",kernel="6.12",revision="` + revision + `",version="v9.9.9"} 1`},
		{"fastblk_node_pids_headroom", `fastblk_node_pids_headroom 180`},
		{"fastblk_quarantined_records", `fastblk_quarantined_records 1`},
		{"fastblk_volume_limit_iops", `fastblk_volume_limit_iops{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 5000`},
		{"fastblk_volume_limit_bytes_per_second", `fastblk_volume_limit_bytes_per_second{device_class="fast",name="pvc-2",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="v2"} 1.048576e+08`},
		{"fastblk_volume_throttled_ios_total", `fastblk_volume_throttled_ios_total{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 7`},
		{"fastblk_volume_throttled_seconds_total", `fastblk_volume_throttled_seconds_total{device_class="default",name="pvc-1",namespace="apps",persistentvolume="pvc-1",persistentvolumeclaim="data",volume_id="v1"} 0.25`},
	} {
		t.Run(tc.metric, func(t *testing.T) {
			out, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, tc.metric)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("missing %s in:\n%s", tc.want, out)
			}
		})
	}
	if n := testutil.CollectAndCount(c, "fastblk_volume_limit_iops"); n != 1 {
		t.Errorf("iops limit gauges = %d, want 1 (only volumes with the limit)", n)
	}
	if n := testutil.CollectAndCount(c, "fastblk_volume_queues"); n != 1 {
		t.Errorf("queue gauges = %d, want 1 (detached volumes have no device)", n)
	}
	unlimited := attached
	unlimited.PidsHeadroom = nil
	unlimited.CopyPacing.Bounded = false
	if n := testutil.CollectAndCount(NewCollector(fixedStatus(unlimited), Startup{}), "fastblk_copy_pacing_allowed_bytes_per_second"); n != 0 {
		t.Errorf("copy allowance gauges while copies are not bounded = %d, want 0", n)
	}
	if n := testutil.CollectAndCount(NewCollector(fixedStatus(unlimited), Startup{}), "fastblk_node_pids_headroom"); n != 0 {
		t.Errorf("pids headroom gauges without a pids limit = %d, want 0", n)
	}
}

// TestHealthzFollowsStatus: /healthz is 503 with the reason when unhealthy.
func TestHealthzFollowsStatus(t *testing.T) {
	sick := attached
	sick.Healthy, sick.HealthError, sick.HealthSummary = false, "data directory: statfs /var/lib/x: read-only file system",
		"data directory: read-only file system"
	for _, tc := range []struct {
		st   driver.NodeStatus
		code int
	}{{attached, http.StatusOK}, {sick, http.StatusServiceUnavailable}} {
		rec := httptest.NewRecorder()
		Handler(fixedStatus(tc.st), Startup{}, false).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != tc.code {
			t.Errorf("healthy=%v: /healthz = %d, want %d (%s)", tc.st.Healthy, rec.Code, tc.code, rec.Body)
		}
		if strings.Contains(rec.Body.String(), "/var/lib") {
			t.Errorf("healthy=%v: /healthz names a host path: %q", tc.st.Healthy, rec.Body)
		}
	}
}

// TestBackendFallbackReported: a backend that fell back from ublk shows as
// fastblk_backend_fallback{reason} and in /healthz; without a fallback the
// family is absent.
func TestBackendFallbackReported(t *testing.T) {
	loop := attached
	loop.Backend = "loop"
	c := NewCollector(fixedStatus(loop), Startup{BackendFallback: "io_uring_refused"})
	want := `
# HELP fastblk_backend_fallback 1 when --backend auto serves with loop devices although the node has ublk, labelled with why (absent otherwise).
# TYPE fastblk_backend_fallback gauge
fastblk_backend_fallback{reason="io_uring_refused"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "fastblk_backend_fallback"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(NewCollector(fixedStatus(attached), Startup{}), "fastblk_backend_fallback"); n != 0 {
		t.Errorf("no fallback: %d fastblk_backend_fallback series, want none", n)
	}
	rec := httptest.NewRecorder()
	Handler(fixedStatus(loop), Startup{BackendFallback: "io_uring_refused"}, false).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, "backend loop: fell back from ublk: io_uring_refused") {
		t.Errorf("/healthz after a fallback = %d %q", rec.Code, body)
	}
}

// TestHealthzNamesHeldVolumes: a volume whose device is held (its state
// lost, its record disagreeing with the kernel) keeps /healthz at 200,
// since a restart would hold it again, and is named there without its
// reason, which names host paths.
func TestHealthzNamesHeldVolumes(t *testing.T) {
	held := attached
	held.Held = map[string]string{"v2": "volume v2: backing file /var/lib/x/v2.img: no such file", "v1": "volume v1: no device is recorded"}
	rec := httptest.NewRecorder()
	Handler(fixedStatus(held), Startup{}, false).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	want := "ok\nvolume v1: device held, not served (see /status)\nvolume v2: device held, not served (see /status)\n"
	if body := rec.Body.String(); rec.Code != http.StatusOK || body != want {
		t.Errorf("/healthz with held volumes = %d %q, want 200 %q", rec.Code, body, want)
	}
	held.FailingIO = map[string]string{"/dev/ublkb3": "2026-12-07T12:00:00Z"}
	rec = httptest.NewRecorder()
	Handler(fixedStatus(held), Startup{}, false).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	want += "ublk device /dev/ublkb3: kept but not re-adopted, fails its i/o since 2026-12-07T12:00:00Z (see /status)\n"
	if body := rec.Body.String(); rec.Code != http.StatusOK || body != want {
		t.Errorf("/healthz with a device failing its i/o = %d %q, want 200 %q", rec.Code, body, want)
	}
}
