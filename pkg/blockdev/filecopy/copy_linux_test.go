package filecopy

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
)

// TestSyncCopy proves the catch-up pass makes a stale copy equal to its
// source for every kind of change (a rewritten block, new data in a hole, a
// punched range, a block zeroed by a write) and keeps holes holes.
func TestSyncCopy(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, 16<<20); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, src, 0, 4<<20, 1)
	testfs.WriteAt(t, src, 8<<20, 2<<20, 2)
	if err := MakeFile(context.Background(), dst, src, 16<<20); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, src, 4096, 4096, 7)   // a block rewritten
	testfs.WriteAt(t, src, 12<<20, 8192, 9) // data where there was a hole
	f, err := os.OpenFile(src, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4096), 2<<20); err != nil { // a block zeroed
		t.Fatal(err)
	}
	// a discard: the second data run becomes a hole
	if err := unixPunch(f, 8<<20, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := ResyncFile(context.Background(), dst, src); err != nil {
		t.Fatal(err)
	}
	testfs.SamePrefix(t, src, dst)
	if a, b := testfs.Allocated(t, dst), testfs.Allocated(t, src); a > b {
		t.Errorf("copy allocates %d bytes, source %d: holes were filled", a, b)
	}
}

func unixPunch(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

func TestRWCopyKeepsZeroBlocksSparse(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	// 4 MiB of written zeros (allocated) with one 4 KiB block of data.
	if err := os.WriteFile(src, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, src, 2<<20, 4096, 9)
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
	testfs.SamePrefix(t, src, dst)
	if a := testfs.Allocated(t, dst); a > 64<<10 {
		t.Fatalf("copy of zeros allocates %d bytes", a)
	}
}
