package quiesce

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func TestFreezeFS(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	thaw, err := FreezeFS(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { thaw() })
	t.Run("frozen", func(t *testing.T) {
		if _, err := FreezeFS(ctx, dir); !errors.Is(err, blockdev.ErrBusy) {
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
