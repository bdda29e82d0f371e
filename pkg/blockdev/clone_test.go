package blockdev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// sparseSource makes a 64 MiB volume with three 1 MiB data runs.
func sparseSource(t *testing.T, s *Store) Volume {
	t.Helper()
	v := mustCreate(t, s, VolumeSpec{Name: "src", SizeBytes: 64 << 20})
	for i, off := range []int64{0, 20 << 20, 63 << 20} {
		writeAt(t, s.VolumeFile(v.ID), off, 1<<20, byte(i+1))
	}
	return v
}

// checkCopies runs the snapshot and clone cases on a store; dataDir's
// filesystem decides whether they reflink or copy.
func checkCopies(t *testing.T, s *Store) {
	src := sparseSource(t, s)
	srcFile := s.VolumeFile(src.ID)
	srcAlloc := allocated(t, srcFile)
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
		samePrefix(t, srcFile, file)
		if a := allocated(t, file); a > srcAlloc {
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
			samePrefix(t, srcFile, file)
			if a := allocated(t, file); a > srcAlloc {
				t.Fatalf("copy allocates %d bytes, source %d: inflated", a, srcAlloc)
			}
		})
	}
	t.Run("smaller-than-source", func(t *testing.T) {
		spec := VolumeSpec{Name: "small", SizeBytes: 32 << 20, SourceSnapshotID: snap.ID}
		if _, err := s.CreateVolume(context.Background(), spec); !errors.Is(err, ErrOutOfRange) {
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
	checkCopies(t, openStore(t, mountTmpfs(t, 512<<20)))
}

func TestRWCopyKeepsZeroBlocksSparse(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	// 4 MiB of written zeros (allocated) with one 4 KiB block of data.
	if err := os.WriteFile(src, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, 2<<20, 4096, 9)
	in, _ := os.Open(src)
	defer in.Close()
	out, _ := os.Create(dst)
	defer out.Close()
	if err := out.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := rwCopy(context.Background(), int(out.Fd()), int(in.Fd()), 0, 4<<20); err != nil {
		t.Fatal(err)
	}
	samePrefix(t, src, dst)
	if a := allocated(t, dst); a > 64<<10 {
		t.Fatalf("copy of zeros allocates %d bytes", a)
	}
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
		"other-source":   {"snap", b.ID, ErrConflict},
		"missing-source": {"x", VolumeID("nope"), ErrNotFound},
		"invalid-source": {"x", "../../x", ErrNotFound},
		"no-name":        {"", a.ID, ErrInvalid},
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
		if _, err := s.Snapshot(SnapshotID("qf")); !errors.Is(err, ErrNotFound) {
			t.Fatal("a failed snapshot was recorded")
		}
	})
	t.Run("resume-fails", func(t *testing.T) {
		boom := errors.New("thaw")
		q := func(context.Context) (func() error, error) { return func() error { return boom }, nil }
		if _, err := s.CreateSnapshot(ctx, "rf", a.ID, q); !errors.Is(err, boom) {
			t.Fatalf("CreateSnapshot = %v, want the resume error", err)
		}
		if _, err := os.Stat(s.dataFile(SnapshotID("rf"))); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("a failed snapshot left its file")
		}
	})
}
