package store

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
)

// TestConsistentSnapshot snapshots a mounted, attached volume whose newest
// writes are still only in the page cache; with quiesce.FreezeVolume as the
// quiesce the snapshot is a clean filesystem that holds them.
func TestConsistentSnapshot(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	lv := mountVolume(t, s, "live", 64<<20)
	v, mnt := lv.v, lv.mnt
	want := []byte("written just before the snapshot, never fsynced\n")
	if err := os.WriteFile(filepath.Join(mnt, "hello"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := s.CreateSnapshot(ctx, "live-snap", v.ID, func(ctx context.Context) (func() error, error) {
		return quiesce.FreezeVolume(ctx, s.Dir(), v.ID, mnt, lv.dev)
	})
	if err != nil {
		t.Fatal(err)
	}
	file := s.dataFile(snap.ID)
	testfs.Run(t, "e2fsck", "-fn", file) // exit 0: clean, nothing to replay
	ro := mountImageRO(t, file)
	if got, err := os.ReadFile(filepath.Join(ro, "hello")); err != nil || string(got) != string(want) {
		t.Fatalf("snapshot holds %q (%v), want %q", got, err, want)
	}
}

// mountImageRO loop-mounts an existing filesystem image read-only.
func mountImageRO(t *testing.T, img string) string {
	t.Helper()
	dir := t.TempDir()
	testfs.Run(t, "mount", "-o", "loop,ro", img, dir)
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}
