package store

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

// allocatedAll fails unless the volume's file has disk blocks for all of
// its size, written ones (data, to SEEK_HOLE) with full preallocation and
// unwritten ones (holes, to SEEK_DATA, as ext4 and xfs report them) with
// falloc, where nothing was written.
func allocatedAll(t *testing.T, s *Store, v blockdev.Volume, data bool) {
	t.Helper()
	file := s.VolumeFile(v.ID)
	if got := testfs.Allocated(t, file); got < v.SizeBytes {
		t.Fatalf("volume %s: %d bytes allocated of %d", v.Name, got, v.SizeBytes)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	switch v.Preallocation {
	case blockdev.PreallocFull:
		if hole, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE); err != nil || hole != v.SizeBytes {
			t.Fatalf("volume %s (full): first hole or unwritten extent at %d (%v), want none before the end %d", v.Name, hole, err, v.SizeBytes)
		}
	case blockdev.PreallocFalloc:
		if off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA); !data && err != unix.ENXIO {
			t.Fatalf("volume %s (falloc): written data at %d (%v), want only unwritten extents", v.Name, off, err)
		}
	}
}

// TestPreallocate checks, on real ext4 and xfs filesystems and for both
// modes, that a preallocated volume's file has blocks for its whole size
// when it is created, restored from a snapshot, cloned and expanded, also
// after the store is opened again (a plugin restart), while a sparse
// volume's has none.
func TestPreallocate(t *testing.T) {
	for _, fs := range []struct {
		name string
		size int64
		mkfs []string
	}{
		{"ext4", 128 << 20, []string{"mkfs.ext4", "-q", "-F", "-m", "0"}},
		{"xfs", 320 << 20, []string{"mkfs.xfs", "-q", "-f"}},
	} {
		for _, mode := range []blockdev.Preallocation{blockdev.PreallocFalloc, blockdev.PreallocFull} {
			t.Run(fs.name+"-"+string(mode), func(t *testing.T) {
				dir := testfs.MountImage(t, fs.size, fs.mkfs[0], fs.mkfs[1:]...)
				testPreallocate(t, dir, mode)
			})
		}
	}
}

func testPreallocate(t *testing.T, dir string, mode blockdev.Preallocation) {
	ctx := context.Background()
	s := openStore(t, dir)
	sparse := mustCreate(t, s, VolumeSpec{Name: "sparse", SizeBytes: 8 << 20})
	if got := testfs.Allocated(t, s.VolumeFile(sparse.ID)); got > slack {
		t.Fatalf("sparse volume: %d bytes allocated", got)
	}
	v := mustCreate(t, s, VolumeSpec{Name: "pre", SizeBytes: 8 << 20, Preallocation: mode})
	if v.Preallocation != mode {
		t.Fatalf("created volume's preallocation %q, want %q", v.Preallocation, mode)
	}
	allocatedAll(t, s, v, false)

	// The record keeps the choice: a restarted plugin's expansion
	// allocates the new range.
	s.Close()
	s = openStore(t, dir)
	if got, err := s.Volume(v.ID); err != nil || got.Preallocation != mode {
		t.Fatalf("after reopening: %+v, %v; want preallocation %q", got, err, mode)
	}
	if v, err := s.ExpandVolume(ctx, v.ID, 20<<20); err != nil || v.SizeBytes != 20<<20 {
		t.Fatalf("ExpandVolume = %d, %v", v.SizeBytes, err)
	} else {
		allocatedAll(t, s, v, false)
	}
	if v, err := s.ExpandVolume(ctx, sparse.ID, 20<<20); err != nil {
		t.Fatal(err)
	} else if got := testfs.Allocated(t, s.VolumeFile(v.ID)); got > slack {
		t.Fatalf("expanded sparse volume: %d bytes allocated", got)
	}

	// A restore or clone into a preallocating class ends fully
	// allocated, with the source's data.
	testfs.WriteAt(t, s.VolumeFile(sparse.ID), 1<<20, 1<<20, 5)
	snap := mustSnapshot(t, s, "snap", sparse.ID)
	for _, spec := range []VolumeSpec{
		{Name: "restored", SizeBytes: 24 << 20, SourceSnapshotID: snap.ID, Preallocation: mode},
		{Name: "cloned", SourceVolumeID: sparse.ID, Preallocation: mode},
	} {
		c := mustCreate(t, s, spec)
		allocatedAll(t, s, c, true)
		testfs.SamePrefix(t, s.VolumeFile(sparse.ID), s.VolumeFile(c.ID))
	}
}

// TestPreallocatedCapacity checks the accounting: a preallocated volume's
// whole size is used from its creation on, and an over-provisioned store
// promises preallocated volumes only the space it has.
func TestPreallocatedCapacity(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountTmpfs(t, 64<<20)
	s := openStore(t, dir)
	avail0 := capacity(t, s)
	v := mustCreate(t, s, VolumeSpec{Name: "pre", SizeBytes: 16 << 20, Preallocation: blockdev.PreallocFalloc})
	if got := capacity(t, s); !near(got, avail0-16<<20) {
		t.Fatalf("available %d after a 16 MiB preallocated volume, want about %d", got, avail0-16<<20)
	}
	testfs.WriteAt(t, s.VolumeFile(v.ID), 0, 4<<20, 3)
	if got := capacity(t, s); !near(got, avail0-16<<20) {
		t.Fatalf("available %d after writing into it, want about %d", got, avail0-16<<20)
	}
	if got, err := s.PreallocatedCapacity(); err != nil || got != capacity(t, s) {
		t.Fatalf("PreallocatedCapacity = %d, %v; want Capacity's %d without over-provisioning", got, err, capacity(t, s))
	}
	s.Close()

	o, err := Open(Config{Dir: dir, OverProvisionRatio: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	free := testfs.Free(t, dir)
	pre, err := o.PreallocatedCapacity()
	if err != nil || !near(pre, free) || !near(capacity(t, o), 2*free) {
		t.Fatalf("ratio 2: PreallocatedCapacity %d (%v), Capacity %d; want about %d and %d", pre, err, capacity(t, o), free, 2*free)
	}
	big := (free + 8<<20) &^ (blockdev.SizeAlign - 1)
	if _, err := o.CreateVolume(ctx, VolumeSpec{Name: "big-pre", SizeBytes: big, Preallocation: blockdev.PreallocFalloc}); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("preallocated create beyond the free space = %v, want ErrNoSpace", err)
	}
	if _, err := o.ExpandVolume(ctx, v.ID, v.SizeBytes+big); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("preallocated expansion beyond the free space = %v, want ErrNoSpace", err)
	}
	mustCreate(t, o, VolumeSpec{Name: "big-sparse", SizeBytes: big}) // over-provisioned, as asked
}

// TestPreallocateDiskFull fills the filesystem after the create passed its
// capacity check (from the source's hold, as another writer of a shared
// disk might), so that the allocation itself fails with ENOSPC: the create
// is ErrNoSpace and leaves no file, record or reservation behind, across a
// reopen too, and the same create succeeds once there is room again.
func TestPreallocateDiskFull(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountImage(t, 128<<20, "mkfs.ext4", "-q", "-F", "-m", "0")
	s := openStore(t, dir)
	src := mustCreate(t, s, VolumeSpec{Name: "src", SizeBytes: 4 << 20})
	testfs.WriteAt(t, s.VolumeFile(src.ID), 0, 1<<20, 9)
	filler := filepath.Join(dir, "filler")
	fill := func(context.Context) (func() error, error) {
		f, err := os.Create(filler)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		// As much as the filesystem gives; ENOSPC ends it.
		if err := unix.Fallocate(int(f.Fd()), 0, 0, 128<<20); err != nil && !errors.Is(err, unix.ENOSPC) {
			return nil, err
		}
		for err == nil {
			_, err = f.Write(make([]byte, 1<<20))
		}
		return func() error { return nil }, nil
	}
	before := capacity(t, s)
	spec := VolumeSpec{Name: "pre", SizeBytes: 32 << 20, SourceVolumeID: src.ID, Preallocation: blockdev.PreallocFalloc, Hold: fill}
	if _, err := s.CreateVolume(ctx, spec); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("CreateVolume on a full disk = %v, want ErrNoSpace", err)
	}
	id := blockdev.VolumeID("pre")
	if _, err := os.Stat(s.VolumeFile(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data file after the failed create: %v", err)
	}
	if _, err := os.Stat(s.metaPath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record after the failed create: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if got := capacity(t, s); !near(got, before) {
		t.Fatalf("available %d after the failed create, %d before: something is still held", got, before)
	}
	s.Close()
	s = openStore(t, dir)
	if _, err := s.Volume(id); !errors.Is(err, blockdev.ErrNotFound) {
		t.Fatalf("after reopening: %v, want no volume", err)
	}
	spec.Hold = nil
	v := mustCreate(t, s, spec)
	allocatedAll(t, s, v, true)
	testfs.SamePrefix(t, s.VolumeFile(src.ID), s.VolumeFile(v.ID))
}

// TestPreallocateIdempotent checks that a repeated create with the same
// spec returns the volume and one that differs only in preallocation is a
// conflict, as CSI asks of a name reused with other parameters.
func TestPreallocateIdempotent(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	spec := VolumeSpec{Name: "pre", SizeBytes: 4 << 20, Preallocation: blockdev.PreallocFalloc}
	v := mustCreate(t, s, spec)
	if again, err := s.CreateVolume(ctx, spec); err != nil || again.ID != v.ID || again.Preallocation != v.Preallocation {
		t.Fatalf("repeated create = %+v, %v; want the same preallocated volume", again, err)
	}
	spec.Preallocation = blockdev.PreallocFull
	if _, err := s.CreateVolume(ctx, spec); !errors.Is(err, blockdev.ErrConflict) {
		t.Fatalf("create of the name with full preallocation = %v, want ErrConflict", err)
	}
	spec.Preallocation = blockdev.PreallocOff
	if _, err := s.CreateVolume(ctx, spec); !errors.Is(err, blockdev.ErrConflict) {
		t.Fatalf("create of the name without preallocation = %v, want ErrConflict", err)
	}
	sparse := mustCreate(t, s, VolumeSpec{Name: "sparse", SizeBytes: 4 << 20})
	if _, err := s.CreateVolume(ctx, VolumeSpec{Name: "sparse", SizeBytes: 4 << 20, Preallocation: blockdev.PreallocFalloc}); !errors.Is(err, blockdev.ErrConflict) {
		t.Fatalf("create of sparse %s with preallocation = %v, want ErrConflict", sparse.ID, err)
	}
}
