package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
	if err := os.WriteFile(filepath.Join(dir, ".tmp-v2-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := loadStates(dir)
	if err != nil || len(got) != 1 || got[0] != st {
		t.Fatalf("loadStates = %+v, %v; want [%+v]", got, err, st)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-v2-123")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file left: %v", err)
	}
	if err := removeState(dir, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := removeState(dir, "v1"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if got, _ := loadStates(dir); len(got) != 0 {
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
