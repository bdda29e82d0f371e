package driver

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestListenSocketMode proves the CSI socket is created owner and group
// only (0660) whatever the process umask, and that a stale socket left by
// an earlier process is replaced.
func TestListenSocketMode(t *testing.T) {
	old := syscall.Umask(0) // the most permissive umask a container may run with
	t.Cleanup(func() { syscall.Umask(old) })
	sock := filepath.Join(t.TempDir(), "csi.sock")
	for range 2 { // the second listen replaces the first's socket
		lis, err := Listen("unix://" + sock)
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if mode := fi.Mode().Perm(); mode != socketMode {
			t.Fatalf("socket mode %#o under umask 0, want %#o: anyone on the node may call the CSI services", mode, socketMode)
		}
	}
}
