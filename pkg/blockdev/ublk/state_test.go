package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// TestStateRoundTrip writes, reloads and removes device records, and checks
// leftover temp files are cleaned and foreign names refused.
func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := State{VolumeID: "v1", DevID: 3, File: "/data/volumes/v1.img", SizeBytes: 1 << 30,
		Tuning: Tuning{Queues: 2, Depth: 32, MaxIOBytes: 128 << 10}, Flags: FlagUserRecovery, Owner: OwnerToken(dir)}
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := States(dir)
	if err != nil || len(got) != 1 || got[0] != st {
		t.Fatalf("States = %+v, %v; want [%+v]", got, err, st)
	}
	if err := removeState(dir, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := removeState(dir, "v1"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if got, _ := States(dir); len(got) != 0 {
		t.Fatalf("left %+v", got)
	}
}

func TestValidName(t *testing.T) {
	for _, id := range []string{"", "../x", "a/b", ".hidden", string(make([]byte, 129))} {
		if err := validName(id); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("validName(%q) = %v, want os.ErrInvalid", id, err)
		}
	}
	if err := validName("v0123abc"); err != nil {
		t.Errorf("validName(v0123abc) = %v", err)
	}
}

func TestOwnerToken(t *testing.T) {
	a, b := OwnerToken("/var/lib/a/ublk"), OwnerToken("/var/lib/b/ublk")
	if a == b || a>>63 != 1 || a != OwnerToken("/var/lib/a/ublk") {
		t.Fatalf("tokens %#x %#x", a, b)
	}
}

// TestStateCorruptFileSetAside proves that a state file that does not
// decode is renamed aside at start-up (never deleted, never read as a
// state again) and listed by Quarantined, while the other states still
// load.
func TestStateCorruptFileSetAside(t *testing.T) {
	dir := t.TempDir()
	good := State{VolumeID: "v1", DevID: 1, File: "/data/volumes/v1.img", Owner: OwnerToken(dir)}
	if err := saveState(dir, good); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"v2.json": "{not json",
		"v3.json": `{"volumeID": "v4"}`, // names another volume
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	scan, err := loadStates(dir, true)
	if err != nil || len(scan.states) != 1 || scan.states[0] != good {
		t.Fatalf("loadStates = %+v, %v; want only %+v", scan, err, good)
	}
	if len(scan.problems) != 2 || len(scan.unreadable) != 2 {
		t.Errorf("loadStates reported %v, unreadable %q; want both corrupt files", scan.problems, scan.unreadable)
	}
	q, err := Quarantined(dir)
	if err != nil || len(q) != 2 || !strings.HasPrefix(q[0], "v2.json.corrupt-") || !strings.HasPrefix(q[1], "v3.json.corrupt-") {
		t.Fatalf("Quarantined = %q, %v; want v2.json and v3.json set aside", q, err)
	}
	for _, name := range []string{"v2.json", "v3.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still in place: %v", name, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, q[0]))
	if err != nil || string(data) != "{not json" {
		t.Fatalf("set-aside file holds %q, %v; want the original bytes", data, err)
	}
}

// TestStateTempFileOfAnotherWriterKept proves that reading the states
// leaves temp files alone (a concurrent Attach of another volume may be
// writing one) and that the start-up clean-up (atomicfile.RemoveStale)
// takes only those older than a minute.
func TestStateTempFileOfAnotherWriterKept(t *testing.T) {
	dir := t.TempDir()
	fresh := filepath.Join(dir, ".tmp-v2.json-123")
	stale := filepath.Join(dir, ".tmp-v3.json-456")
	for _, p := range []string{fresh, stale} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := States(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fresh, stale} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("States removed %s: %v", p, err)
		}
	}
	if err := atomicfile.RemoveStale(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file removed: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file kept: %v", err)
	}
}
