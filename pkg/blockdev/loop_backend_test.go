package blockdev_test

import (
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backendtest"
)

func TestLoopBackend(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend {
		b, err := blockdev.NewBackend("loop", blockdev.BackendConfig{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
