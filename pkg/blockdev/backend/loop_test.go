package backend_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend/backendtest"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

func TestLoopBackend(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend {
		b, err := backend.New("loop", backend.Config{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestLoopBackendLeavesForeignDevices proves that the loop backend acts only
// on loop devices carrying its own mark: a device someone else bound to the
// same volume file (another node on this kernel reports the same path) is
// never listed, adopted or detached.
func TestLoopBackendLeavesForeignDevices(t *testing.T) {
	ctx := context.Background()
	s, v, foreign := volumeWithUnmarkedDevice(t)
	dataDir, file := s.Dir(), s.VolumeFile(v.ID)

	b, err := backend.New("loop", backend.Config{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Detach(ctx, v.ID) })
	if l, err := b.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("List = %+v, %v; want nothing (the only device is foreign)", l, err)
	}
	d, err := b.Attach(ctx, blockdev.AttachRequest{VolumeID: v.ID, File: file, SizeBytes: v.SizeBytes})
	if err != nil {
		t.Fatal(err)
	}
	if d.Path == foreign.Path {
		t.Fatalf("Attach adopted the foreign device %s", foreign.Path)
	}
	if l, _ := b.List(ctx); len(l) != 1 || l[0].Path != d.Path {
		t.Fatalf("List = %+v, want only %s", l, d.Path)
	}
	if err := b.Detach(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := loop.Get(foreign.Number); err != nil || got.BackingFile != file {
		t.Fatalf("foreign device after Detach: %+v, %v; want it still bound to %s", got, err, file)
	}
}

// TestLoopBackendAdoptsUnmarkedDevicesOnUpgrade proves the upgrade from a
// plugin without owner marks: on the data directory's first start with
// AdoptUnmarked, the loop device such a plugin bound to a volume file
// (named by its path) is marked and served as the volume's device, not
// doubled, with its settings kept; later starts adopt nothing more.
func TestLoopBackendAdoptsUnmarkedDevicesOnUpgrade(t *testing.T) {
	ctx := context.Background()
	s, v, old := volumeWithUnmarkedDevice(t)
	dataDir, file := s.Dir(), s.VolumeFile(v.ID)
	cfg := backend.Config{DataDir: dataDir, DevDir: filepath.Join(dataDir, "dev"), AdoptUnmarked: true}
	b, err := backend.New("loop", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Detach(ctx, v.ID) })
	d, err := b.Attach(ctx, blockdev.AttachRequest{VolumeID: v.ID, File: file, SizeBytes: v.SizeBytes})
	if err != nil || d.Path != old.Path {
		t.Fatalf("Attach after the upgrade = %+v, %v; want the old device %s", d, err, old.Path)
	}
	if got, err := loop.Get(old.Number); err != nil || !got.DirectIO || got.BlockSize != 4096 {
		t.Fatalf("adopted device %+v, %v: settings lost", got, err)
	}
	if err := b.Detach(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if found, _ := loop.Find(file); len(found) != 0 {
		t.Fatalf("devices left: %+v", found)
	}

	// Once: a device bound the same way later is someone else's.
	later, err := loop.Attach(file, loop.Options{DirectIO: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(later.Path, 10*time.Second)
	again, err := backend.New("loop", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := again.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("second start lists %+v, %v; want the later unmarked device left alone", l, err)
	}
}

// volumeWithUnmarkedDevice opens a store on a new data directory, creates a
// volume, and binds its file to a loop device without a mark (losetup's
// name, as plugins before the marks did), detached at the test's end.
func volumeWithUnmarkedDevice(t *testing.T) (*store.Store, blockdev.Volume, loop.Device) {
	t.Helper()
	testgate.RequireLoop(t)
	s, err := store.Open(store.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.CreateVolume(context.Background(), store.VolumeSpec{Name: "staged", SizeBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d, err := loop.Attach(s.VolumeFile(v.ID), loop.Options{DirectIO: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(d.Path, 10*time.Second) })
	return s, v, d
}
