package main

import (
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

// TestPrintStatusMaxIO proves the status table shows each attached
// volume's largest request, and a dash where the backend has none (loop).
func TestPrintStatusMaxIO(t *testing.T) {
	st := driver.NodeStatus{Volumes: []driver.VolumeStatus{
		{ID: "vublk", Name: "pvc-a", SizeBytes: 1 << 30, Device: "/dev/ublkb0", Backend: "ublk",
			Tuning: blockdev.Tuning{Queues: 2, QueueDepth: 32, MaxIOBytes: 512 << 10}},
		{ID: "vloop", Name: "pvc-b", SizeBytes: 1 << 30, Device: "/dev/loop0", Backend: "loop"},
	}}
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
				if h == "MAX-IO" {
					got[f[0]] = f[i]
				}
			}
		}
	}
	want := map[string]string{"vublk": "512.0KiB", "vloop": "-"}
	if len(got) != len(want) || got["vublk"] != want["vublk"] || got["vloop"] != want["vloop"] {
		t.Errorf("MAX-IO per volume %v, want %v\n%s", got, want, b.String())
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
