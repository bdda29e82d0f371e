package main

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

// statusColumn prints st and returns one column of the volume table,
// by volume ID.
func statusColumn(t *testing.T, st driver.NodeStatus, column string) map[string]string {
	t.Helper()
	var b strings.Builder
	printStatus(&b, st)
	var head []string
	got := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "VOLUME":
			head = f
		case head != nil && len(f) == len(head):
			for i, h := range head {
				if h == column {
					got[f[0]] = f[i]
				}
			}
		case head != nil && len(f) > 0:
			t.Fatalf("row with %d cells under %d headings:\n%s", len(f), len(head), b.String())
		}
	}
	return got
}

var statusVolumes = []driver.VolumeStatus{
	{ID: "vublk", Name: "pvc-a", SizeBytes: 1 << 30, Device: "/dev/ublkb0", Backend: "ublk",
		Tuning: blockdev.Tuning{Queues: 2, QueueDepth: 32, MaxIOBytes: 512 << 10},
		Limits: qos.Limits{IOPS: 5000, BytesPerSecond: 200 << 20}},
	{ID: "vloop", Name: "pvc-b", SizeBytes: 1 << 30, Device: "/dev/loop0", Backend: "loop"},
	{ID: "vdet", Name: "pvc-c", SizeBytes: 1 << 30, Limits: qos.Limits{IOPS: 100}},
}

// TestPrintStatusMaxIO proves the status table shows each attached
// volume's largest request, and a dash where the backend has none (loop).
func TestPrintStatusMaxIO(t *testing.T) {
	got := statusColumn(t, driver.NodeStatus{Volumes: statusVolumes}, "MAX-IO")
	want := map[string]string{"vublk": "512.0KiB", "vloop": "-", "vdet": "-"}
	if !maps.Equal(got, want) {
		t.Errorf("MAX-IO per volume %v, want %v", got, want)
	}
}

// TestPrintStatusLimits proves the status table shows each volume's rate
// limits in one cell, attached or not, and a dash without any.
func TestPrintStatusLimits(t *testing.T) {
	got := statusColumn(t, driver.NodeStatus{Volumes: statusVolumes}, "LIMIT")
	want := map[string]string{"vublk": "5000iops,200.0MiB/s", "vloop": "-", "vdet": "100iops"}
	if !maps.Equal(got, want) {
		t.Errorf("LIMIT per volume %v, want %v", got, want)
	}
}

// TestPrintStatusPidsHeadroom proves the summary line shows the pids
// headroom only when the plugin has a pids limit.
func TestPrintStatusPidsHeadroom(t *testing.T) {
	room := int64(42)
	for _, c := range []struct {
		room *int64
		want bool
	}{{&room, true}, {nil, false}} {
		var b strings.Builder
		printStatus(&b, driver.NodeStatus{PidsHeadroom: c.room})
		if got := strings.Contains(b.String(), "pids headroom 42"); got != c.want {
			t.Errorf("headroom %v: summary shows it %v, want %v:\n%s", c.room, got, c.want, b.String())
		}
	}
}

// TestPrintStatusQuarantined proves that records set aside as unreadable
// are shown loudly, path by path, and that nothing is shown without them.
func TestPrintStatusQuarantined(t *testing.T) {
	const p = "/var/lib/csi-fastblk/meta/v3.json.corrupt-20261202T003000.000000000Z"
	var b strings.Builder
	printStatus(&b, driver.NodeStatus{Quarantined: []string{p}})
	if !strings.Contains(b.String(), "QUARANTINED: 1 unreadable record") || !strings.Contains(b.String(), "  "+p+"\n") {
		t.Errorf("status does not show the quarantined record:\n%s", b.String())
	}
	b.Reset()
	printStatus(&b, driver.NodeStatus{})
	if strings.Contains(b.String(), "QUARANTINED") {
		t.Errorf("status shows a quarantine without one:\n%s", b.String())
	}
}

// TestPrintStatusPulls shows each copy in flight from another node.
// TestPrintStatusFailingIO proves that ublk devices whose I/O the plugin
// fails (it cannot re-adopt them) are named, with since when and what to
// do, and that nothing is printed without them.
func TestPrintStatusFailingIO(t *testing.T) {
	var b strings.Builder
	printStatus(&b, driver.NodeStatus{FailingIO: map[string]string{"/dev/ublkb3": "2026-12-07T12:00:00Z"}})
	if !strings.Contains(b.String(), "FAILING I/O: 1 ublk device(s)") || !strings.Contains(b.String(), "  /dev/ublkb3 since 2026-12-07T12:00:00Z\n") ||
		!strings.Contains(b.String(), "restart the plugin") {
		t.Fatalf("status with a device failing its i/o:\n%s", b.String())
	}
	b.Reset()
	printStatus(&b, driver.NodeStatus{})
	if strings.Contains(b.String(), "FAILING") {
		t.Fatalf("status without one:\n%s", b.String())
	}
}

func TestPrintStatusPulls(t *testing.T) {
	var b strings.Builder
	printStatus(&b, driver.NodeStatus{Pulls: []driver.PullStatus{{VolumeID: "v1", Name: "pvc-1", Source: "s1-n1", SourceNode: "n1",
		SizeBytes: 1 << 30, ExpectedBytes: 512 << 20, ReceivedBytes: 128 << 20, Seconds: 3}}})
	if !strings.Contains(b.String(), "COPYING into v1 (pvc-1) from s1-n1 on node n1: ") {
		t.Errorf("status does not show the copy:\n%s", b.String())
	}
}

// TestPrintStatusClasses proves status lists every device class and each
// volume's, and names a class the node cannot serve with why and the
// volumes it keeps out of service.
func TestPrintStatusClasses(t *testing.T) {
	vols := slices.Clone(statusVolumes)
	vols[0].Class, vols[1].Class = "default", "nvme"
	st := driver.NodeStatus{Volumes: vols, Classes: []driver.ClassStatus{
		{Name: "default", Path: "/var/lib/csi-fastblk", CapacityAvailable: 10 << 30, CapacityTotal: 20 << 30, Volumes: 1},
		{Name: "nvme", Path: "/mnt/fastblk/nvme", CapacityAvailable: 1 << 30, CapacityTotal: 2 << 30, Volumes: 1, Snapshots: 3},
		{Name: "old", Path: "/mnt/old", Unavailable: true, Error: "removed from the configuration while 1 of its volumes are in /mnt/old",
			Stranded: []string{"v0123.old.n1"}},
	}}
	if got := statusColumn(t, st, "CLASS"); !maps.Equal(got, map[string]string{"vublk": "default", "vloop": "nvme", "vdet": "-"}) {
		t.Errorf("CLASS per volume %v", got)
	}
	var b strings.Builder
	printStatus(&b, st)
	rows := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for class, want := range map[string]string{
		"nvme": "nvme /mnt/fastblk/nvme 1.0GiB 2.0GiB 0B 1 3 served",
		"old":  "old /mnt/old - - - 0 - UNAVAILABLE",
	} {
		if rows[class] != want {
			t.Errorf("class row %q, want %q:\n%s", rows[class], want, b.String())
		}
	}
	for _, want := range []string{"UNAVAILABLE device class old: removed from the configuration",
		"  1 volume(s) out of service, their files kept in /mnt/old:\n    v0123.old.n1\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// TestPrintStatusDegradedByClass proves the status's first line does not
// call a node healthy while one of its device classes cannot be served:
// it says degraded and names the class (the plugin itself stays live, as
// restarting it would not bring the class back).
func TestPrintStatusDegradedByClass(t *testing.T) {
	st := driver.NodeStatus{Healthy: true, Classes: []driver.ClassStatus{
		{Name: "default", Path: "/var/lib/csi-fastblk"},
		{Name: "old", Path: "/mnt/old", Unavailable: true, Error: "not mounted"},
		{Name: "hdd", Path: "/mnt/hdd", Unavailable: true, Error: "not mounted"},
	}}
	var b strings.Builder
	printStatus(&b, st)
	first, _, _ := strings.Cut(b.String(), "\n")
	if !strings.HasSuffix(first, "  DEGRADED: device classes old, hdd unavailable") {
		t.Errorf("first line %q, want it to end with DEGRADED naming the classes", first)
	}
	b.Reset()
	st.Classes = st.Classes[:1]
	printStatus(&b, st)
	if first, _, _ := strings.Cut(b.String(), "\n"); !strings.HasSuffix(first, "  healthy") {
		t.Errorf("first line %q, want healthy with every class served", first)
	}
}
