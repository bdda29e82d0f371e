package blockdev

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFreezeFS(t *testing.T) {
	ctx := context.Background()
	dir := mountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	thaw, err := FreezeFS(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { thaw() })
	t.Run("frozen", func(t *testing.T) {
		if _, err := FreezeFS(ctx, dir); !errors.Is(err, ErrBusy) {
			t.Fatalf("second FreezeFS = %v, want ErrBusy (already frozen)", err)
		}
	})
	t.Run("thaw", func(t *testing.T) {
		if err := thaw(); err != nil {
			t.Fatal(err)
		}
		if err := thaw(); err != nil {
			t.Fatalf("second thaw = %v, want nil", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "after"), []byte("x"), 0o600); err != nil {
			t.Fatalf("write after thaw: %v", err)
		}
	})
	t.Run("missing-path", func(t *testing.T) {
		if _, err := FreezeFS(ctx, filepath.Join(dir, "nope")); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("FreezeFS of a missing path = %v, want ENOENT", err)
		}
	})
}

// TestConsistentSnapshot snapshots a mounted, attached volume whose newest
// writes are still only in the page cache; with the store's FreezeFS as the
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
		return s.FreezeFS(ctx, v.ID, mnt, lv.dev)
	})
	if err != nil {
		t.Fatal(err)
	}
	file := s.dataFile(snap.ID)
	run(t, "e2fsck", "-fn", file) // exit 0: clean, nothing to replay
	ro := mountImageRO(t, file)
	if got, err := os.ReadFile(filepath.Join(ro, "hello")); err != nil || string(got) != string(want) {
		t.Fatalf("snapshot holds %q (%v), want %q", got, err, want)
	}
}

// mountImageRO loop-mounts an existing filesystem image read-only.
func mountImageRO(t *testing.T, img string) string {
	t.Helper()
	dir := t.TempDir()
	run(t, "mount", "-o", "loop,ro", img, dir)
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}
