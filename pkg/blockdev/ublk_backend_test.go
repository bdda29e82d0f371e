package blockdev_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backendtest"
)

// TestUblkBackend runs the backend conformance suite on ublk. It needs a
// kernel with ublk_drv (the VM: hack/vm/run.sh); elsewhere it skips.
func TestUblkBackend(t *testing.T) {
	if _, err := os.Stat(blockdev.UblkControl); err != nil {
		t.Skipf("no %s on this kernel: run in the VM (hack/vm/run.sh)", blockdev.UblkControl)
	}
	backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend {
		b, err := blockdev.NewBackend("ublk", blockdev.BackendConfig{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
