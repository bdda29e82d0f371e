package filecopy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

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

// TestAllocateDiskFull grows a file by more than its filesystem holds, on
// tmpfs and on ext4 (which keeps what a failed fallocate got), with and
// without written zeros: Allocate fails with ENOSPC and leaves the file as
// it was, its size, its data and its blocks, and the filesystem's free
// space with it.
func TestAllocateDiskFull(t *testing.T) {
	for name, mount := range map[string]func(t *testing.T) string{
		"tmpfs": func(t *testing.T) string { return testfs.MountTmpfs(t, 16<<20) },
		"ext4":  func(t *testing.T) string { return testfs.MountImage(t, 32<<20, "mkfs.ext4", "-q", "-F", "-m", "0") },
	} {
		for _, written := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s-written=%t", name, written), func(t *testing.T) { testAllocateDiskFull(t, mount(t), written) })
		}
	}
}

func testAllocateDiskFull(t *testing.T, dir string, written bool) {
	file := filepath.Join(dir, "vol")
	if err := MakeFile(context.Background(), file, "", 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := Allocate(file, 0, 1<<20, written); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, file, 0, 1<<20, 4)
	blocks, free := testfs.Allocated(t, file), testfs.Free(t, dir)
	err := Allocate(file, 1<<20, 64<<20, written)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Allocate beyond the filesystem = %v, want ENOSPC", err)
	}
	if st, err := os.Stat(file); err != nil || st.Size() != 1<<20 {
		t.Fatalf("after the failed allocation: %v, %v; want 1 MiB", st, err)
	}
	// A block or two of extent tree may stay (ext4).
	const slack = 64 << 10
	if got := testfs.Allocated(t, file); got-blocks > slack {
		t.Fatalf("%d bytes allocated after the failed allocation, %d before", got, blocks)
	}
	if got := testfs.Free(t, dir); free-got > slack {
		t.Fatalf("filesystem free %d after the failed allocation, %d before", got, free)
	}
	data, err := os.ReadFile(file)
	if err != nil || len(data) != 1<<20 || data[0] != 4 || data[len(data)-1] != 4+byte((1<<20-1)%251) {
		t.Fatalf("data after the failed allocation: %d bytes, %v", len(data), err)
	}
}

// TestAllocateWritten checks that written allocation leaves no unwritten
// extent (ext4 and xfs report those as holes to SEEK_HOLE) and reads as
// zeros, and that plain allocation leaves only unwritten ones.
func TestAllocateWritten(t *testing.T) {
	for _, fs := range []struct {
		name string
		size int64
		mkfs []string
	}{
		{"ext4", 64 << 20, []string{"mkfs.ext4", "-q", "-F"}},
		{"xfs", 320 << 20, []string{"mkfs.xfs", "-q", "-f"}},
	} {
		t.Run(fs.name, func(t *testing.T) {
			dir := testfs.MountImage(t, fs.size, fs.mkfs[0], fs.mkfs[1:]...)
			for _, written := range []bool{false, true} {
				file := filepath.Join(dir, fmt.Sprint(written))
				if err := MakeFile(context.Background(), file, "", 0); err != nil {
					t.Fatal(err)
				}
				const size = 8<<20 + 4096 // not a whole number of chunks
				if err := Allocate(file, 0, size, written); err != nil {
					t.Fatal(err)
				}
				f, err := os.Open(file)
				if err != nil {
					t.Fatal(err)
				}
				hole, herr := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
				f.Close()
				if written && (herr != nil || hole != size) || !written && (herr != nil || hole != 0) {
					t.Errorf("written=%t: first hole at %d (%v)", written, hole, herr)
				}
				if got := testfs.Allocated(t, file); got < size {
					t.Errorf("written=%t: %d bytes allocated of %d", written, got, size)
				}
				data, err := os.ReadFile(file)
				if err != nil || len(data) != size || !allZero(data) {
					t.Errorf("written=%t: %d bytes read (%v), want %d zeros", written, len(data), err, size)
				}
			}
		})
	}
}

// TestDataExtents: the allocated ranges of a sparse file, in order, and
// none past the size asked for.
func TestDataExtents(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 16<<20); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, file, 1<<20, 1<<20, 1)
	testfs.WriteAt(t, file, 15<<20, 1<<20, 2)
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		size int64
		want string
	}{
		{16 << 20, "[[1048576 2097152] [15728640 16777216]]"},
		{15<<20 + 4096, "[[1048576 2097152] [15728640 15732736]]"},
		{1 << 20, "[]"},
	} {
		got, err := DataExtents(f, tc.size)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("DataExtents(%d) = %v, %v; want %s", tc.size, got, err, tc.want)
		}
	}
	if n, err := AllocatedBytes(f); err != nil || n != testfs.Allocated(t, file) {
		t.Errorf("AllocatedBytes = %d, %v", n, err)
	}
}

// countingPacer counts what a copy asks of it, and fails the Wait after
// failAfter bytes when that is set.
type countingPacer struct {
	expect, moved, waits, largest int64
	failAfter                     int64
}

func (p *countingPacer) Expect(n int64) { p.expect = n }

func (p *countingPacer) Wait(_ context.Context, n int) error {
	if p.failAfter > 0 && p.moved >= p.failAfter {
		return context.Canceled
	}
	p.moved += int64(n)
	p.waits++
	p.largest = max(p.largest, int64(n))
	return nil
}

// TestCopyFilePaced: a copy made under a Pacer (WithPacer) tells it the
// source's allocated bytes first, then asks it before every chunk of at
// most pacedChunk bytes, for the data runs only (holes stay holes); a
// Pacer that refuses stops the copy with its error.
func TestCopyFilePaced(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, 64<<20); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, src, 0, 3<<20+4096, 1)
	testfs.WriteAt(t, src, 40<<20, 2<<20, 2)
	p := &countingPacer{}
	dst := filepath.Join(dir, "dst")
	if err := CopyFile(WithPacer(context.Background(), p), dst, src, 64<<20); err != nil {
		t.Fatal(err)
	}
	testfs.SamePrefix(t, src, dst)
	alloc := testfs.Allocated(t, src)
	if p.expect != alloc || p.moved < 5<<20+4096 || p.moved > alloc || p.largest > pacedChunk || p.waits < 6 {
		t.Errorf("pacer: expected %d (allocated %d), told of %d bytes in %d waits of at most %d; want the data runs in chunks of at most %d",
			p.expect, alloc, p.moved, p.waits, p.largest, pacedChunk)
	}
	if a := testfs.Allocated(t, dst); a > alloc {
		t.Errorf("the copy allocates %d bytes, the source %d: holes were filled", a, alloc)
	}

	refuse := &countingPacer{failAfter: 2 << 20}
	err := CopyFile(WithPacer(context.Background(), refuse), filepath.Join(dir, "dst2"), src, 64<<20)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("copy under a Pacer that refuses: %v, want its error", err)
	}
}

// TestCopyFilePacedWritesBehind: a paced copy's writes go to the disk as
// it goes, not in one burst at its sync: what it wrote more than
// writeBehindLag ago is written back and out of the page cache when it
// returns (on ext4, where the pages of an unpaced copy stay, dirty).
func TestCopyFilePacedWritesBehind(t *testing.T) {
	dir := testfs.MountImage(t, 160<<20, "mkfs.ext4", "-q", "-F")
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testfs.WriteAt(t, src, 0, 32<<20, 3)
	for _, paced := range []bool{false, true} {
		dst := filepath.Join(dir, fmt.Sprint("dst-", paced))
		ctx := context.Background()
		if paced {
			ctx = WithPacer(ctx, &countingPacer{})
		}
		if err := CopyFile(ctx, dst, src, 32<<20); err != nil {
			t.Fatal(err)
		}
		resident := residentBytes(t, dst)
		if paced && resident > writeBehindLag+pacedChunk {
			t.Errorf("paced copy: %d bytes of it still in the page cache, want at most %d", resident, writeBehindLag+pacedChunk)
		}
		if !paced && resident < 24<<20 {
			t.Logf("unpaced copy: only %d bytes of it in the page cache (expected most of 32 MiB)", resident)
		}
		testfs.SamePrefix(t, src, dst)
	}
}

// residentBytes is how much of file is in the page cache (mincore).
func residentBytes(t *testing.T, file string) int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += int64(page)
		}
	}
	return n
}
