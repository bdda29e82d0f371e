// Package testfs makes the filesystems and files kernel tests run on: loop-mounted
// images made with mkfs and sized tmpfs mounts, each removed again in
// t.Cleanup. Every helper needs root (testgate.RequireRoot); a missing mkfs
// skips through testgate, so FASTBLK_REQUIRE=root turns it into a failure.
package testfs

import (
	"os"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/mountinfo"
)

// MountImage makes a filesystem image of size bytes with mkfs (args), loop-
// mounts it on a new directory and returns that directory. Unmounting and
// detaching happen in t.Cleanup.
func MountImage(t testing.TB, size int64, mkfs string, args ...string) string {
	t.Helper()
	testgate.RequireLoop(t)
	testgate.RequireTool(t, mkfs)
	img := t.TempDir() + "/fs.img"
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	Run(t, mkfs, append(args, img)...)
	dir := t.TempDir()
	Run(t, "mount", "-o", "loop", img, dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// MountTmpfs mounts a tmpfs of size bytes: a filesystem of its own whose
// free space only this test changes.
func MountTmpfs(t testing.TB, size int64) string {
	t.Helper()
	testgate.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// MountedExt4 mounts a fresh 32 MiB ext4 image and returns its entry in
// the mount table.
func MountedExt4(t testing.TB) mountinfo.MountInfo {
	t.Helper()
	dir := MountImage(t, 32<<20, "mkfs.ext4", "-q", "-F")
	mounts, err := mountinfo.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := mountinfo.FindMount(mounts, dir)
	if !ok {
		t.Fatalf("%s not in the mount table", dir)
	}
	return m
}

// Run runs a command and fails t with its output when it fails.
func Run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// Freezable is a mounted filesystem a test freezes (FIFREEZE: writes wait
// in the kernel until the thaw) and thaws.
type Freezable struct {
	Dir string
	fd  int
}

// FIFREEZE and FITHAW, _IOWR('X', 119, int) and _IOWR('X', 120, int).
const fiFreeze, fiThaw = 0xc0045877, 0xc0045878

// MountFreezable mounts a fresh 64 MiB ext4 image for a test to freeze.
func MountFreezable(t testing.TB) *Freezable {
	t.Helper()
	testgate.RequireRoot(t)
	dir := MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &Freezable{Dir: dir, fd: fd}
}

// Freeze freezes the filesystem.
func (f *Freezable) Freeze(t testing.TB) {
	if err := unix.IoctlSetInt(f.fd, fiFreeze, 0); err != nil {
		t.Fatalf("freeze %s: %v", f.Dir, err)
	}
}

// Thaw thaws it; it may run on any goroutine.
func (f *Freezable) Thaw(t testing.TB) {
	if err := unix.IoctlSetInt(f.fd, fiThaw, 0); err != nil {
		t.Errorf("thaw %s: %v", f.Dir, err)
	}
}
