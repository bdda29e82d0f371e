package testfs

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// WriteAt writes n bytes of a pattern seeded by seed into file at off.
func WriteAt(t testing.TB, file string, off int64, n int, seed byte) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i%251)
	}
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// Free is the bytes of dir's filesystem an unprivileged writer may still
// take (statfs f_bavail).
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// Allocated is the bytes of disk the file uses (st_blocks).
func Allocated(t testing.TB, file string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// SamePrefix checks that b starts with the whole content of a and that the
// rest of b is zero.
func SamePrefix(t testing.TB, a, b string) {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(db) < len(da) || !bytes.Equal(da, db[:len(da)]) {
		t.Fatalf("%s does not hold %s's content", b, a)
	}
	if rest := db[len(da):]; !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Fatalf("%s has data past %s's end", b, a)
	}
}

// DropCache writes back file's dirty pages and drops its pages from the
// page cache, so that the next reads of it come from the disk.
func DropCache(t testing.TB, file string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// Sparse makes file, a sparse file of size bytes (no block allocated), and
// returns its path.
func Sparse(t testing.TB, file string, size int64) string {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return file
}
