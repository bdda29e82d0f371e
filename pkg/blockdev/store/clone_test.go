package store

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// sparseSource makes a 64 MiB volume with three 1 MiB data runs.
func sparseSource(t *testing.T, s *Store) blockdev.Volume {
	t.Helper()
	v := mustCreate(t, s, VolumeSpec{Name: "src", SizeBytes: 64 << 20})
	for i, off := range []int64{0, 20 << 20, 63 << 20} {
		testfs.WriteAt(t, s.VolumeFile(v.ID), off, 1<<20, byte(i+1))
	}
	return v
}

// checkCopies runs the snapshot and clone cases on a store; dataDir's
// filesystem decides whether they reflink or copy.
func checkCopies(t *testing.T, s *Store) {
	src := sparseSource(t, s)
	srcFile := s.VolumeFile(src.ID)
	srcAlloc := testfs.Allocated(t, srcFile)
	snap := mustSnapshot(t, s, "snap", src.ID)
	cases := []struct {
		name string
		spec VolumeSpec
		size int64
	}{
		{"from-snapshot", VolumeSpec{Name: "restore", SourceSnapshotID: snap.ID}, 64 << 20},
		{"from-snapshot-larger", VolumeSpec{Name: "restore-big", SizeBytes: 128 << 20, SourceSnapshotID: snap.ID}, 128 << 20},
		{"clone", VolumeSpec{Name: "clone", SizeBytes: 64 << 20, SourceVolumeID: src.ID}, 64 << 20},
	}
	t.Run("snapshot", func(t *testing.T) {
		file := s.dataFile(snap.ID)
		testfs.SamePrefix(t, srcFile, file)
		if a := testfs.Allocated(t, file); a > srcAlloc {
			t.Fatalf("snapshot allocates %d bytes, source %d: the copy inflated", a, srcAlloc)
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := mustCreate(t, s, tc.spec)
			file := s.VolumeFile(v.ID)
			if v.SizeBytes != tc.size {
				t.Fatalf("size %d, want %d", v.SizeBytes, tc.size)
			}
			testfs.SamePrefix(t, srcFile, file)
			if a := testfs.Allocated(t, file); a > srcAlloc {
				t.Fatalf("copy allocates %d bytes, source %d: inflated", a, srcAlloc)
			}
		})
	}
	t.Run("smaller-than-source", func(t *testing.T) {
		spec := VolumeSpec{Name: "small", SizeBytes: 32 << 20, SourceSnapshotID: snap.ID}
		if _, err := s.CreateVolume(context.Background(), spec); !errors.Is(err, blockdev.ErrOutOfRange) {
			t.Fatalf("CreateVolume smaller than its source = %v, want ErrOutOfRange", err)
		}
	})
}

func TestCopiesOnDataDir(t *testing.T) {
	checkCopies(t, openStore(t, t.TempDir()))
}

// TestCopiesOnTmpfs covers a filesystem without reflink or copy_file_range
// reflinks: the SEEK_DATA/SEEK_HOLE copy.
func TestCopiesOnTmpfs(t *testing.T) {
	checkCopies(t, openStore(t, testfs.MountTmpfs(t, 512<<20)))
}

func TestSnapshotSemantics(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	a := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	b := mustCreate(t, s, VolumeSpec{Name: "b", SizeBytes: 1 << 20})
	snap := mustSnapshot(t, s, "snap", a.ID)
	t.Run("idempotent", func(t *testing.T) {
		if again := mustSnapshot(t, s, "snap", a.ID); again != snap {
			t.Fatalf("repeat gave %+v, want %+v", again, snap)
		}
	})
	for label, tc := range map[string]struct {
		name, src string
		want      error
	}{
		"other-source":   {"snap", b.ID, blockdev.ErrConflict},
		"missing-source": {"x", blockdev.VolumeID("nope"), blockdev.ErrNotFound},
		"invalid-source": {"x", "../../x", blockdev.ErrNotFound},
		"no-name":        {"", a.ID, blockdev.ErrInvalid},
	} {
		t.Run(label, func(t *testing.T) {
			if _, err := s.CreateSnapshot(ctx, tc.name, tc.src, nil); !errors.Is(err, tc.want) {
				t.Fatalf("CreateSnapshot(%q, %q) = %v, want %v", tc.name, tc.src, err, tc.want)
			}
		})
	}
	t.Run("quiesce", func(t *testing.T) {
		var quiesced, resumed int
		q := func(context.Context) (func() error, error) {
			quiesced++
			return func() error { resumed++; return nil }, nil
		}
		if _, err := s.CreateSnapshot(ctx, "q", a.ID, q); err != nil {
			t.Fatal(err)
		}
		if quiesced != 1 || resumed != 1 {
			t.Fatalf("quiesced %d, resumed %d; want 1, 1", quiesced, resumed)
		}
	})
	t.Run("quiesce-fails", func(t *testing.T) {
		boom := errors.New("boom")
		q := func(context.Context) (func() error, error) { return nil, boom }
		if _, err := s.CreateSnapshot(ctx, "qf", a.ID, q); !errors.Is(err, boom) {
			t.Fatalf("CreateSnapshot = %v, want the quiesce error", err)
		}
		if _, err := s.Snapshot(blockdev.SnapshotID("qf")); !errors.Is(err, blockdev.ErrNotFound) {
			t.Fatal("a failed snapshot was recorded")
		}
	})
	t.Run("resume-fails", func(t *testing.T) {
		boom := errors.New("thaw")
		q := func(context.Context) (func() error, error) { return func() error { return boom }, nil }
		if _, err := s.CreateSnapshot(ctx, "rf", a.ID, q); !errors.Is(err, boom) {
			t.Fatalf("CreateSnapshot = %v, want the resume error", err)
		}
		if _, err := os.Stat(s.dataFile(blockdev.SnapshotID("rf"))); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("a failed snapshot left its file")
		}
	})
}
