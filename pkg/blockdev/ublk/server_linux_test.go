package ublk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// needUblk skips unless this kernel serves ublk devices (root and
// /dev/ublk-control; the VM runs these tests) and returns its features.
func needUblk(t *testing.T) uint64 {
	t.Helper()
	testgate.RequireUblk(t)
	f, err := HaveUblk()
	if err != nil {
		t.Fatalf("ublk present but unusable: %v", err)
	}
	return f
}

// scratchDir is a directory on a filesystem with O_DIRECT: $FASTBLK_DATA
// (the VM's /data disk) when set, else a test temp dir.
func scratchDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("FASTBLK_DATA")
	if base == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(base, "ublk-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func sparseFile(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

func newTestServer(t *testing.T, stateDir string) *Server {
	t.Helper()
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("start-up: %v", e)
	}
	return s
}

func pattern(n int, seed byte) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = byte(i>>9) ^ seed
	}
	return b
}

// writeRead writes a pattern through the device with O_DIRECT at off and
// reads it back; with check false it only reads and compares.
func writeRead(t *testing.T, dev string, off int64, seed byte, write bool) {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dev, err)
	}
	defer unix.Close(fd)
	want := pattern(256<<10, seed)
	if write {
		if n, err := unix.Pwrite(fd, want, off); err != nil || n != len(want) {
			t.Fatalf("write %s: %d, %v", dev, n, err)
		}
		if err := unix.Fsync(fd); err != nil {
			t.Fatalf("fsync %s: %v", dev, err)
		}
	}
	got := pattern(len(want), ^seed)
	if n, err := unix.Pread(fd, got, off); err != nil || n != len(got) || !slices.Equal(got, want) {
		t.Fatalf("read back %s: %d, %v, equal %v", dev, n, err, slices.Equal(got, want))
	}
}

// maxSectorsKB reads the largest request the kernel sends block device dev
// (/dev/ublkbN), in KiB: its queue's max_hw_sectors_kb.
func maxSectorsKB(t *testing.T, dev string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue/max_hw_sectors_kb"))
	if err != nil {
		t.Fatal(err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("max_hw_sectors_kb of %s: %v", dev, err)
	}
	return kb
}

func TestControlFeatures(t *testing.T) {
	f := needUblk(t)
	t.Logf("features %#x: %s", f, FormatFlags(f))
	if f&FlagUserRecovery == 0 || f&FlagCmdIoctlEncode == 0 {
		t.Fatalf("features %s lack USER_RECOVERY or CMD_IOCTL_ENCODE", FormatFlags(f))
	}
}

func TestServerLifecycle(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 64<<20)
	s := newTestServer(t, filepath.Join(dir, "state"))
	defer s.Close()
	ctx := context.Background()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached %s: %+v, NOWAIT writes %v", d.Path, d.Tuning, d.NowaitWrites)
	t.Run("idempotent", func(t *testing.T) {
		again, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
		if err != nil || again.Path != d.Path {
			t.Fatalf("second attach: %+v, %v", again, err)
		}
	})
	t.Run("io", func(t *testing.T) {
		writeRead(t, d.Path, 1<<20, 0x5a, true)
		back := make([]byte, 256<<10)
		f, _ := os.Open(file)
		defer f.Close()
		if _, err := f.ReadAt(back, 1<<20); err != nil || !slices.Equal(back, pattern(len(back), 0x5a)) {
			t.Fatalf("backing file does not hold the data (%v)", err)
		}
	})
	t.Run("state recorded", func(t *testing.T) {
		sts, err := States(filepath.Join(dir, "state"))
		if err != nil || len(sts) != 1 || sts[0].DevID != d.DevID {
			t.Fatalf("states %+v, %v", sts, err)
		}
	})
	t.Run("nowait writes where the filesystem needs them", func(t *testing.T) {
		refuses, err := dataplane.StaleMtimeRefusesNowait(dir)
		if err != nil {
			t.Fatal(err)
		}
		if d.NowaitWrites != refuses {
			t.Fatalf("NowaitWrites %v, but the filesystem of %s refuses NOWAIT writes over a stale mtime: %v", d.NowaitWrites, dir, refuses)
		}
	})
	t.Run("resize", func(t *testing.T) { checkResize(t, s, d, file) })
	t.Run("detach busy", func(t *testing.T) {
		fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := s.Detach(ctx, "vol"); !errors.Is(err, unix.EBUSY) {
			t.Fatalf("detach of a held device = %v, want EBUSY", err)
		}
	})
	t.Run("detach", func(t *testing.T) {
		if err := s.Detach(ctx, "vol"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(d.Path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there: %v", d.Path, err)
		}
		if err := s.Detach(ctx, "vol"); err != nil {
			t.Fatalf("second detach: %v", err)
		}
		if sts, _ := States(filepath.Join(dir, "state")); len(sts) != 0 {
			t.Fatalf("state left: %+v", sts)
		}
	})
}

func checkResize(t *testing.T, s *Server, d Served, file string) {
	if err := os.Truncate(file, 128<<20); err != nil {
		t.Fatal(err)
	}
	err := s.Resize(context.Background(), d.VolumeID, 128<<20)
	if d.Flags&FlagUpdateSize == 0 {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("resize without UPDATE_SIZE = %v, want ErrUnsupported", err)
		}
		testgate.Skip(t, testgate.UpdateSize, "driver lacks UPDATE_SIZE")
	}
	if err != nil {
		t.Fatal(err)
	}
	if n, err := DeviceSize(d.DevID); err != nil || n != 128<<20 {
		t.Fatalf("device size %d, %v; want %d", n, err, 128<<20)
	}
	writeRead(t, d.Path, 100<<20, 0x33, true)
}
