package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func importSpec(name string) VolumeSpec {
	return VolumeSpec{Name: name, SizeBytes: 8 << 20, SourceSnapshotID: blockdev.SnapshotID("snap"), SourceNode: "n1"}
}

// listDir names the files below the store's data directories.
func listDir(t *testing.T, s *Store) string {
	t.Helper()
	var names []string
	for _, sub := range []string{"volumes", "snapshots", "meta"} {
		ents, err := os.ReadDir(filepath.Join(s.Dir(), sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			names = append(names, sub+"/"+e.Name())
		}
	}
	return strings.Join(names, " ")
}

// TestImport: an imported volume exists only once committed, with its
// source node recorded (and read back after a restart); a repeated begin
// finds it, and one with another spec conflicts.
func TestImport(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	ctx := context.Background()
	_, imp, err := s.BeginImport(ctx, importSpec("pvc-in"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := imp.File().WriteAt(bytes.Repeat([]byte{7}, 4096), 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Volume(imp.Volume().ID); !errors.Is(err, blockdev.ErrNotFound) || len(s.Volumes()) != 0 {
		t.Fatalf("an import in progress is visible: %v, %v", err, s.Volumes())
	}
	v, err := imp.Commit()
	if err != nil || v.SourceNode != "n1" || v.SizeBytes != 8<<20 {
		t.Fatalf("Commit: %+v, %v", v, err)
	}
	if err := imp.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	if got := testfs.Allocated(t, s.VolumeFile(v.ID)); got != 4096 {
		t.Errorf("the imported file takes %d bytes, want the one block written", got)
	}
	again, imp2, err := s.BeginImport(ctx, importSpec("pvc-in"))
	if err != nil || imp2 != nil || again.ID != v.ID {
		t.Errorf("BeginImport of an existing volume: %+v, %v, %v", again, imp2, err)
	}
	other := importSpec("pvc-in")
	other.SourceNode = "n3"
	if _, _, err := s.BeginImport(ctx, other); !errors.Is(err, blockdev.ErrConflict) {
		t.Errorf("BeginImport from another node: %v, want ErrConflict", err)
	}
	if _, err := s.CreateVolume(ctx, importSpec("pvc-local")); !errors.Is(err, blockdev.ErrInvalid) {
		t.Errorf("CreateVolume with a source node: %v, want ErrInvalid", err)
	}
	s.Close()
	s2 := openStore(t, dir)
	if got, err := s2.Volume(v.ID); err != nil || got.SourceNode != "n1" {
		t.Errorf("after a restart: %+v, %v", got, err)
	}
}

// TestImportCrashOrAbort: an import aborted, or cut by a crash (the store
// opened again before Commit), leaves nothing behind.
func TestImportCrashOrAbort(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	empty := listDir(t, s)
	_, imp, err := s.BeginImport(context.Background(), importSpec("pvc-crash"))
	if err != nil {
		t.Fatal(err)
	}
	imp.File().WriteAt([]byte("data"), 0)
	if listDir(t, s) == empty {
		t.Fatal("BeginImport made no record or file")
	}
	s2 := openStore(t, dir) // what a restart after a crash finds
	if got := listDir(t, s2); got != empty {
		t.Errorf("after a crash mid-import: %s, want %q", got, empty)
	}
	_, imp, err = s2.BeginImport(context.Background(), importSpec("pvc-abort"))
	if err != nil {
		t.Fatal(err)
	}
	if err := imp.Abort(); err != nil {
		t.Fatal(err)
	}
	if got := listDir(t, s2); got != empty {
		t.Errorf("after Abort: %s, want %q", got, empty)
	}
}

// TestCopyVolume: the copy a peer is sent has the volume's data and no
// name; the volume is unchanged.
func TestCopyVolume(t *testing.T) {
	s := openStore(t, t.TempDir())
	src := sparseSource(t, s)
	before := listDir(t, s)
	want, err := os.ReadFile(s.VolumeFile(src.ID))
	if err != nil {
		t.Fatal(err)
	}
	f, size, err := s.CopyVolume(context.Background(), src.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil || size != src.SizeBytes || !bytes.Equal(got, want) {
		t.Errorf("the copy: %d bytes, %v; differs from the volume's %d", size, err, len(want))
	}
	if now := listDir(t, s); now != before {
		t.Errorf("the data directory after the copy: %s, was %s", now, before)
	}
	if _, _, err := s.CopyVolume(context.Background(), "../x", nil); !errors.Is(err, blockdev.ErrNotFound) {
		t.Errorf("CopyVolume of a path: %v", err)
	}
	if _, _, err := s.OpenSnapshot(context.Background(), src.ID); !errors.Is(err, blockdev.ErrNotFound) {
		t.Errorf("OpenSnapshot of a volume ID: %v", err)
	}
}
