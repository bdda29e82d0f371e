package filelock

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// TestLock proves the lock is exclusive while held (a second Lock, on its
// own open file as another process's would be, fails with ErrBusy) and
// free again after release.
func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock.lock")
	release, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(path); !errors.Is(err, blockdev.ErrBusy) {
		t.Fatalf("second Lock while held = %v, want ErrBusy", err)
	}
	release()
	again, err := Lock(path)
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	again()
}
