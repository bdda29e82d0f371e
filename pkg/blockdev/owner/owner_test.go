package owner

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// TestOwnerTokenFollowsTheDirectory proves that the owner token belongs to
// the data directory, not to the path used to reach it: the same after a
// rename and through a symlink, different for another directory.
func TestOwnerTokenFollowsTheDirectory(t *testing.T) {
	base := t.TempDir()
	a, b, link := filepath.Join(base, "a"), filepath.Join(base, "b"), filepath.Join(base, "link")
	if err := os.Mkdir(a, 0o700); err != nil {
		t.Fatal(err)
	}
	tok, err := Ensure(a)
	if err != nil || tok>>63 != 1 {
		t.Fatalf("Ensure = %#x, %v; want a token with the top bit set", tok, err)
	}
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{b, link, b + "/."} {
		if got, err := Ensure(p); err != nil || got != tok {
			t.Errorf("Ensure(%s) = %#x, %v; want %#x", p, got, err, tok)
		}
	}
	if other, err := Ensure(t.TempDir()); err != nil || other == tok {
		t.Errorf("another directory's token %#x, %v; want one of its own", other, err)
	}
}

// TestOwnerTokenAdoptsLegacyToken proves the upgrade: a data directory whose
// ublk devices were recorded with the old path-derived token keeps that
// token (written to its owner file the first time), so the upgraded plugin
// re-adopts them, and keeps it after a rename.
func TestOwnerTokenAdoptsLegacyToken(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	legacy := ublk.OwnerToken(filepath.Join(dir, blockdev.UblkStateDir))
	st, _ := json.Marshal(ublk.State{VolumeID: "v1", DevID: 3, File: filepath.Join(dir, "volumes/v1.img"), SizeBytes: 1 << 20,
		Tuning: ublk.Tuning{Queues: 1, Depth: 64, MaxIOBytes: 128 << 10, BufferBytes: 8 << 20}, Flags: ublk.FlagUserRecovery, Owner: legacy})
	if err := os.MkdirAll(filepath.Join(dir, blockdev.UblkStateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, blockdev.UblkStateDir, "v1.json"), st, 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := Read(dir); err != nil || tok != legacy {
		t.Fatalf("Read of a recorded directory = %#x, %v; want the recorded %#x", tok, err, legacy)
	}
	if _, err := os.Stat(filepath.Join(dir, ownerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read wrote the owner file (%v)", err)
	}
	if tok, err := Ensure(dir); err != nil || tok != legacy {
		t.Fatalf("Ensure of a recorded directory = %#x, %v; want the recorded %#x", tok, err, legacy)
	}
	moved := filepath.Join(base, "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if tok, err := Ensure(moved); err != nil || tok != legacy {
		t.Fatalf("Ensure after a rename = %#x, %v; want %#x", tok, err, legacy)
	}
}

// TestOwnerTokenRefusesCorruptFile proves that an owner file that does not
// parse is an error, never silently replaced by a new token (which would
// disown every device of the directory).
func TestOwnerTokenRefusesCorruptFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte("zz\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := Ensure(dir); err == nil {
		t.Fatalf("Ensure with a corrupt owner file = %#x, want an error", tok)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, ownerFile)); string(data) != "zz\n" {
		t.Fatalf("owner file rewritten: %q", data)
	}
}

// TestReadChangesNothing proves that Read only reads: a directory without
// an owner file has token 0 and stays empty, a missing one stays missing,
// and once Ensure made the token Read returns it.
func TestReadChangesNothing(t *testing.T) {
	empty, missing := t.TempDir(), filepath.Join(t.TempDir(), "gone")
	for _, dir := range []string{empty, missing} {
		if tok, err := Read(dir); err != nil || tok != 0 {
			t.Errorf("Read(%s) = %#x, %v; want 0, nil", dir, tok, err)
		}
	}
	if ents, err := os.ReadDir(empty); err != nil || len(ents) != 0 {
		t.Errorf("Read wrote into %s: %v, %v", empty, ents, err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read created %s (%v)", missing, err)
	}
	tok, err := Ensure(empty)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Read(empty); err != nil || got != tok {
		t.Errorf("Read after Ensure = %#x, %v; want %#x", got, err, tok)
	}
}
