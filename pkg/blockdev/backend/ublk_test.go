package backend_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend/backendtest"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// TestUblkBackend runs the backend conformance suite on ublk. It needs a
// kernel with ublk_drv (the VM: hack/vm/run.sh); elsewhere it skips.
func TestUblkBackend(t *testing.T) {
	testgate.RequireUblk(t)
	backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend {
		b, err := backend.New("ublk", backend.Config{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestUblkBackendBatchIO runs the conformance suite with batch commands
// (BatchIO "on") where the kernel offers UBLK_F_BATCH_IO (7.0+).
func TestUblkBackendBatchIO(t *testing.T) {
	testgate.RequireUblk(t)
	if f, err := ublk.HaveUblk(); err != nil || f&ublk.FlagBatchIO == 0 {
		testgate.Skip(t, testgate.BatchIO, "ublk driver without BATCH_IO (features %#x, %v)", f, err)
	}
	backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend {
		b, err := backend.New("ublk", backend.Config{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev"), BatchIO: "on"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestUblkBackendRefusesBadBatchIO proves a BatchIO other than off, auto
// or on is refused before anything is opened (so it needs no ublk).
func TestUblkBackendRefusesBadBatchIO(t *testing.T) {
	dir := t.TempDir()
	b, err := backend.New("ublk", backend.Config{DataDir: dir, BatchIO: "yes"})
	if !errors.Is(err, blockdev.ErrInvalid) {
		if b != nil {
			b.Close()
		}
		t.Fatalf("NewBackend with BatchIO yes = %v, want ErrInvalid", err)
	}
}

// TestUblkBackendMaxIOBytes proves that a volume's MaxIOBytes reaches the
// device (in copy mode; zero copy takes 1 MiB whatever is asked), and that
// one above 1 MiB is refused before it could be narrowed to 32 bits.
func TestUblkBackendMaxIOBytes(t *testing.T) {
	testgate.RequireUblk(t)
	dir := t.TempDir()
	b, err := backend.New("ublk", backend.Config{DataDir: dir, DevDir: filepath.Join(dir, "dev")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	file := filepath.Join(dir, "vol.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 64<<20); err != nil {
		t.Fatal(err)
	}
	id := blockdev.VolumeID("maxio")
	ctx := context.Background()
	req := blockdev.AttachRequest{VolumeID: id, File: file, SizeBytes: 64 << 20,
		Tuning: blockdev.Tuning{MaxIOBytes: 4<<30 + 4096}}
	if d, err := b.Attach(ctx, req); !errors.Is(err, blockdev.ErrInvalid) {
		b.Detach(ctx, id)
		t.Fatalf("Attach with 4 GiB + 4 KiB requests = %+v, %v; want ErrInvalid", d, err)
	}
	req.Tuning = blockdev.Tuning{Queues: 1, QueueDepth: 8, MaxIOBytes: 256 << 10}
	d, err := b.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Detach(ctx, id)
	if got := d.Tuning.MaxIOBytes; got != 256<<10 && got != 1<<20 {
		t.Errorf("device tuning %+v: want 256 KiB requests (1 MiB with zero copy)", d.Tuning)
	}
}
