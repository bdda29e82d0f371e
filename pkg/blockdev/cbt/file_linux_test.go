package cbt

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
)

// filesystems are where the extent map is read: the test's own directory,
// and as root a tmpfs and loop-mounted ext4 and xfs (reflink) images.
func filesystems(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"tempdir": func(t *testing.T) string { return t.TempDir() },
		"tmpfs":   func(t *testing.T) string { return testfs.MountTmpfs(t, 64<<20) },
		"ext4":    func(t *testing.T) string { return testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F") },
		"xfs": func(t *testing.T) string {
			return testfs.MountImage(t, 320<<20, "mkfs.xfs", "-q", "-f", "-m", "reflink=1")
		},
	}
}

func writeAt(t *testing.T, f *os.File, off int64, n int, seed byte) {
	t.Helper()
	buf := bytes.Repeat([]byte{seed}, n)
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatal(err)
	}
}

// TestAllocatedSparseFile writes known ranges into a sparse file and reads
// them back from the extent map, on each filesystem.
func TestAllocatedSparseFile(t *testing.T) {
	for name, dir := range filesystems(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir(t), "snap.img")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const size = 16 << 20
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			writeAt(t, f, 1<<20, 64<<10, 1)
			writeAt(t, f, 4<<20, 1<<20, 2)
			writeAt(t, f, size-4096, 4096, 3)
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := Allocated(context.Background(), path, size)
			if err != nil {
				t.Fatal(err)
			}
			want := []Extent{{1 << 20, 64 << 10}, {4 << 20, 1 << 20}, {size - 4096, 4096}}
			// A filesystem may allocate in larger units than written;
			// it must never leave out a written byte, nor report most
			// of the holes.
			if !covers(got, want) || Total(got) > Total(want)+3*(1<<20) {
				t.Fatalf("allocated = %v, want about %v", got, want)
			}
			if clipped, _ := Allocated(context.Background(), path, 2<<20); !slices.Equal(clipped, Clip(got, 0, 2<<20)) {
				t.Fatalf("allocated to 2 MiB = %v", clipped)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		if _, err := Allocated(context.Background(), filepath.Join(t.TempDir(), "none"), 10); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v", err)
		}
	})
}

func covers(got, want []Extent) bool {
	for _, w := range want {
		if Total(Clip(got, w.Offset, w.End())) != w.Length {
			return false
		}
	}
	return true
}

// TestCompareMatchesBruteForce writes random ranges (data, zeros, holes
// punched) into a copy of a file and compares Compare's answer with a
// block-by-block comparison of the two files' bytes.
func TestCompareMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		dir := t.TempDir()
		const size = 8 << 20
		a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		fa, _ := os.Create(a)
		fb, _ := os.Create(b)
		fa.Truncate(size)
		fb.Truncate(size - int64(rng.IntN(2))*(1<<20)) // b may be shorter: its tail reads as zeros
		for range 10 {
			off, n := rng.Int64N(size-(256<<10)), 1+rng.IntN(256<<10)
			seed := byte(rng.IntN(3)) // 0 writes zeros over data or holes
			writeAt(t, fa, off, n, seed)
			writeAt(t, fb, off, n, seed)
		}
		for range 1 + rng.IntN(8) {
			off, n := rng.Int64N(size-(256<<10)), 1+rng.IntN(256<<10)
			writeAt(t, fb, off, n, byte(rng.IntN(3)))
		}
		fa.Close()
		fb.Close()
		got, err := Compare(context.Background(), a, b, size)
		if err != nil {
			t.Fatal(err)
		}
		if want := bruteDiff(t, a, b, size); !slices.Equal(got, want) {
			t.Fatalf("round %d: compare = %v, want %v", round, got, want)
		}
	}
}

func bruteDiff(t *testing.T, a, b string, size int) []Extent {
	t.Helper()
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	da = append(da, make([]byte, size-len(da))...)
	db = append(db, make([]byte, size-len(db))...)
	var out []Extent
	for off := 0; off < size; off += BlockSize {
		if !bytes.Equal(da[off:off+BlockSize], db[off:off+BlockSize]) {
			out = append(out, Extent{int64(off), BlockSize})
		}
	}
	return Normalize(out)
}

func TestCompareStopsWhenCancelled(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(a, bytes.Repeat([]byte{1}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Compare(ctx, a, a, 4<<20); err == nil {
		t.Fatal("cancelled compare returned no error")
	}
}
