package ublk

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
)

// TestServerKeepsAllocated checks that a device attached with
// KeepAllocated zeroes a WRITE_ZEROES without NOUNMAP in place, so that
// the preallocated file keeps every block (before, it punched a hole, as
// it still does for a thin volume), and that a re-adopted device keeps
// the choice. A punch on the block device is such a WRITE_ZEROES; ext4
// sends the same for its inode tables and its zero-out of extents.
func TestServerKeepsAllocated(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	state := filepath.Join(dir, "state")
	ctx := context.Background()
	s, errs, err := NewServer(ctx, ServerConfig{StateDir: state})
	if err != nil || len(errs) != 0 {
		t.Fatalf("start: %v, %v", err, errs)
	}
	files := map[string]string{}
	paths := map[string]string{}
	for _, id := range []string{"thick", "thin"} {
		files[id] = allocatedFile(t, dir, id+".img", 32<<20)
		d, err := s.Attach(ctx, AttachSpec{VolumeID: id, File: files[id], KeepAllocated: id == "thick"})
		if err != nil {
			t.Fatal(err)
		}
		paths[id] = d.Path
		writeRead(t, d.Path, 1<<20, 5, true)
	}
	punchDevice(t, paths["thin"], 1<<20, 4<<20)
	if got, want := testfs.Allocated(t, files["thin"]), int64(28<<20); got > want {
		t.Errorf("thin volume: %d bytes allocated after a 4 MiB punch of its device, want at most %d (the hole)", got, want)
	}
	check := func(when string) {
		t.Helper()
		punchDevice(t, paths["thick"], 1<<20, 4<<20)
		if got := testfs.Allocated(t, files["thick"]); got < 32<<20 {
			t.Errorf("%s: preallocated volume has %d of its %d bytes allocated after a punch of its device", when, got, 32<<20)
		}
		expectZeros(t, paths["thick"], 1<<20, 4<<20)
	}
	check("attached")

	// A restart re-adopts the device from its state file, choice included.
	writeRead(t, paths["thick"], 1<<20, 6, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, errs, err := NewServer(ctx, ServerConfig{StateDir: state})
	if err != nil || len(errs) != 0 {
		t.Fatalf("restart: %v, %v", err, errs)
	}
	defer s2.Close()
	for id := range paths {
		defer func() {
			if err := s2.Detach(ctx, id); err != nil {
				t.Errorf("detach %s: %v", id, err)
			}
		}()
	}
	check("re-adopted")
}

// allocatedFile makes a file of size bytes with all its blocks allocated
// (fallocate mode 0, as a preallocated volume's).
func allocatedFile(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		t.Fatal(err)
	}
	if got := testfs.Allocated(t, path); got < size {
		t.Fatalf("%s: %d bytes allocated, want %d", name, got, size)
	}
	return path
}

// punchDevice punches [off, off+n) of the block device dev: the kernel
// sends it to the driver as WRITE_ZEROES without NOUNMAP.
func punchDevice(t *testing.T, dev string, off, n int64) {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		t.Fatalf("punch %s: %v", dev, err)
	}
}

// expectZeros reads [off, off+n) of dev directly and fails unless it is
// all zeros.
func expectZeros(t *testing.T, dev string, off, n int64) {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := pattern(int(n), 1) // page-aligned, and not zeros before the read
	if _, err := unix.Pread(fd, buf, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, n)) {
		t.Errorf("%s: [%d, %d) not zeros after a punch", dev, off, off+n)
	}
}
