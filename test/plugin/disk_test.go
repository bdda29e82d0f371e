package plugin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// Data directories on filesystems of their own, small enough to fill.

// smallFS mounts a new ext4 filesystem of size bytes (an image file on a
// loop device) at dir and unmounts it when the test ends.
func smallFS(t *testing.T, dir string, size int64) {
	t.Helper()
	// -m 0: no blocks reserved for root, which the plugin is.
	imageFS(t, dir, size, "mkfs.ext4", "-q", "-F", "-m", "0")
}

// reflinkFS is smallFS with xfs and reflink, the chart README's dedicated
// data disk: a snapshot or clone shares its source's blocks until either
// is written. mkfs.xfs refuses filesystems under 300 MB (xfsprogs 5.19 and
// later). It skips the test where mkfs.xfs is missing.
func reflinkFS(t *testing.T, dir string, size int64) {
	t.Helper()
	testgate.RequireTool(t, "mkfs.xfs")
	imageFS(t, dir, size, "mkfs.xfs", "-q", "-f", "-m", "reflink=1")
}

// imageFS mounts at dir a new filesystem of size bytes on an image file on
// a loop device, made by the command mkfs with the image as its last
// argument, and unmounts it when the test ends.
func imageFS(t *testing.T, dir string, size int64, mkfs ...string) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", mkfs[0], img, err, out)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", img, err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Logf("unmount %s: %v; detaching it", dir, err)
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
}

// freeBytes is the space the filesystem holding dir has for unprivileged
// users (statfs f_bavail), as the plugin counts it.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillMargin is the free space fillUp leaves to writes after its
// fallocate: room for the file's own metadata, since a fallocate that
// finds too little fails (ext4) or keeps what it took past the file's end
// (xfs).
const fillMargin = 8 << 20

// fillUp takes, with one file at path, every block its filesystem still
// gives a writer, and returns how many bytes it took. A fallocate takes
// most of them at once (no data is written: fast, and light on an image
// file in memory); writes take the rest until ENOSPC. It writes again
// while the filesystem reports free space that the last round's writeback
// gave back (xfs reserves for a delayed allocation more than it may need,
// and returns the rest when the data is written), until a round takes
// nothing more.
func fillUp(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	if free := freeBytes(t, filepath.Dir(path)); free > 2*fillMargin {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, free-fillMargin); err != nil {
			t.Fatalf("fill %s: fallocate %d bytes: %v", path, free-fillMargin, err)
		}
		n = free - fillMargin
	}
	for {
		var round int64
		for _, chunk := range []int{1 << 20, 4 << 10} {
			buf := make([]byte, chunk)
			for {
				k, err := f.Write(buf)
				round += int64(k)
				if errors.Is(err, unix.ENOSPC) {
					break
				}
				if err != nil {
					t.Fatalf("fill %s: %v", path, err)
				}
			}
		}
		if err := f.Sync(); err != nil && !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("fill %s: %v", path, err)
		}
		n += round
		if round == 0 || freeBytes(t, filepath.Dir(path)) == 0 {
			return n
		}
	}
}
