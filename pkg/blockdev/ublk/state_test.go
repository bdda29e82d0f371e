package ublk

import (
	"encoding/json"
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
	st := validState(dir, "v1")
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

// validState is a complete State of volume id, as the Server writes one.
func validState(dir, id string) State {
	return State{VolumeID: id, DevID: 3, File: "/data/volumes/" + id + ".img", SizeBytes: 1 << 30,
		Tuning: Tuning{Queues: 2, Depth: 32, MaxIOBytes: 128 << 10, BufferBytes: 8 << 20},
		Flags:  FlagUserRecovery | FlagCmdIoctlEncode, Owner: OwnerToken(dir)}
}

// TestStateBeforeUserCopy reads a state file as the servers before user
// copy wrote it for a copy-mode device on 6.12 (no userCopy, no poolBytes):
// it must load as that device, copying as copy mode with its 128 KiB
// requests, so that an upgraded plugin re-adopts it as it is.
func TestStateBeforeUserCopy(t *testing.T) {
	dir := t.TempDir()
	old := `{
  "volumeID": "pvc-1",
  "devID": 0,
  "file": "/var/lib/csi-fastblk/volumes/pvc-1.img",
  "sizeBytes": 1073741824,
  "tuning": {
    "queues": 2,
    "depth": 64,
    "maxIOBytes": 131072,
    "bufferBytes": 16777216
  },
  "flags": 90,
  "owner": 12321170234011377943
}`
	if err := os.WriteFile(filepath.Join(dir, "pvc-1.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	sts, err := States(dir)
	if err != nil || len(sts) != 1 {
		t.Fatalf("States = %+v, %v", sts, err)
	}
	st := sts[0]
	if st.Tuning.CopyMode() != "copy" || st.Tuning.MaxIOBytes != 128<<10 || st.Tuning.PoolBytes != 0 || userCopy(st.Flags) {
		t.Fatalf("state before user copy read as %+v, flags %s", st.Tuning, FormatFlags(st.Flags))
	}
}

// TestStateUserCopyRoundTrip saves and reads back the state of a
// user-copy device: its mode and pool survive.
func TestStateUserCopyRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := validState(dir, "uc")
	st.Tuning = Tuning{Queues: 2, Depth: 64, MaxIOBytes: 1 << 20, UserCopy: true, PoolBytes: 14 << 20, BufferBytes: 16 << 20}
	st.Flags |= FlagUserCopy
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := States(dir)
	if err != nil || len(got) != 1 || got[0] != st || got[0].Tuning.CopyMode() != "user-copy" {
		t.Fatalf("States = %+v, %v; want [%+v]", got, err, st)
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
	good := validState(dir, "v1")
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

// TestStateInvalidFileSetAside proves that a state file that decodes but
// is not a complete State (see State.validate) is treated as one that does
// not decode: never returned, reported, and at start-up renamed aside with
// its bytes kept, while the valid states still load. (adopt then leaves
// any device it may name alone: TestServerSweepKeepsDeviceOfCorruptState.)
func TestStateInvalidFileSetAside(t *testing.T) {
	dir := t.TempDir()
	good := validState(dir, "v1")
	if err := saveState(dir, good); err != nil {
		t.Fatal(err)
	}
	edit := func(f func(*State)) func(id string) []byte {
		return func(id string) []byte {
			st := validState(dir, id)
			f(&st)
			data, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
	cases := []struct {
		id   string
		data func(id string) []byte
	}{
		{"only-id", func(id string) []byte { return []byte(`{"volumeID":"` + id + `"}`) }},
		{"negative-iops", func(id string) []byte { return []byte(`{"volumeID":"` + id + `","limits":{"iops":-5}}`) }},
		{".hidden", edit(func(*State) {})},
		{"no-device-id", func(id string) []byte {
			var m map[string]any
			if err := json.Unmarshal(edit(func(*State) {})(id), &m); err != nil {
				t.Fatal(err)
			}
			delete(m, "devID")
			data, _ := json.Marshal(m)
			return data
		}},
		{"no-file", edit(func(st *State) { st.File = "" })},
		{"relative-file", edit(func(st *State) { st.File = "volumes/x.img" })},
		{"zero-size", edit(func(st *State) { st.SizeBytes = 0 })},
		{"unaligned-size", edit(func(st *State) { st.SizeBytes = 1<<30 + 512 })},
		{"no-queues", edit(func(st *State) { st.Tuning.Queues = 0 })},
		{"depth-not-a-power-of-two", edit(func(st *State) { st.Tuning.Depth = 48 })},
		{"no-max-io", edit(func(st *State) { st.Tuning.MaxIOBytes = 0 })},
		{"bandwidth-limit-too-low", edit(func(st *State) { st.Limits.BytesPerSecond = 1 })},
		{"no-user-recovery", edit(func(st *State) { st.Flags = FlagCmdIoctlEncode })},
		{"not-an-owner-token", edit(func(st *State) { st.Owner = 1 })},
	}
	files := map[string][]byte{}
	for _, c := range cases {
		files[c.id+stateSuffix] = c.data(c.id)
		if err := os.WriteFile(statePath(dir, c.id), files[c.id+stateSuffix], 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// Reading reports them and changes nothing.
	sts, err := States(dir)
	if len(sts) != 1 || sts[0] != good || err == nil {
		t.Fatalf("States = %+v, %v; want only %+v and an error", sts, err, good)
	}
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("States changed %s: %v", name, err)
		}
	}

	// Start-up sets them aside.
	scan, err := loadStates(dir, true)
	if err != nil || len(scan.states) != 1 || scan.states[0] != good {
		t.Fatalf("loadStates = %+v, %v; want only %+v", scan.states, err, good)
	}
	if len(scan.problems) != len(cases) || len(scan.unreadable) != len(cases) {
		t.Errorf("loadStates reported %v, unreadable %q; want every invalid file", scan.problems, scan.unreadable)
	}
	q, err := Quarantined(dir)
	if err != nil || len(q) != len(cases) {
		t.Fatalf("Quarantined = %q, %v; want the %d invalid files", q, err, len(cases))
	}
	for _, set := range q {
		name, _, _ := strings.Cut(set, corruptMark)
		want, ok := files[name]
		if data, err := os.ReadFile(filepath.Join(dir, set)); !ok || err != nil || string(data) != string(want) {
			t.Errorf("%s holds %q, %v; want the original bytes of %s", set, data, err, name)
		}
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still in place: %v", name, err)
		}
	}

	// The next start finds them set aside, and still unaccounted for.
	scan, err = loadStates(dir, true)
	if err != nil || len(scan.states) != 1 || len(scan.unreadable) != len(cases) || len(scan.problems) != 0 {
		t.Fatalf("second loadStates = %+v, %v; want %+v and the %d set-aside files", scan, err, good, len(cases))
	}
}

// TestSaveStateRefusesInvalid proves that the Server never writes a state
// file it would set aside when it reads it again.
func TestSaveStateRefusesInvalid(t *testing.T) {
	dir := t.TempDir()
	st := validState(dir, "v1")
	st.File = "v1.img"
	if err := saveState(dir, st); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("saveState of %+v = %v, want os.ErrInvalid", st, err)
	}
	if _, err := os.Stat(statePath(dir, "v1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file written: %v", err)
	}
}

// TestStateSharedDeviceSetAside proves that two state files naming one
// device are both set aside, neither returned (re-adopting the device
// from the wrong one would serve a volume from another's file), while a
// state of another device still loads.
func TestStateSharedDeviceSetAside(t *testing.T) {
	dir := t.TempDir()
	a, b, other := validState(dir, "a"), validState(dir, "b"), validState(dir, "other")
	other.DevID = a.DevID + 1
	for _, st := range []State{a, b, other} {
		if err := saveState(dir, st); err != nil {
			t.Fatal(err)
		}
	}
	if sts, err := States(dir); len(sts) != 1 || sts[0] != other || err == nil {
		t.Fatalf("States = %+v, %v; want only %+v and an error", sts, err, other)
	}
	scan, err := loadStates(dir, true)
	if err != nil || len(scan.states) != 1 || scan.states[0] != other || len(scan.problems) != 2 || len(scan.unreadable) != 2 {
		t.Fatalf("loadStates = %+v, %v; want only %+v, and a and b reported", scan, err, other)
	}
	q, err := Quarantined(dir)
	if err != nil || len(q) != 2 || !strings.HasPrefix(q[0], "a.json"+corruptMark) || !strings.HasPrefix(q[1], "b.json"+corruptMark) {
		t.Fatalf("Quarantined = %q, %v; want a.json and b.json set aside", q, err)
	}
}
