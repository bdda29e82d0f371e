package backendtest

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func (s *suite) directIO(t *testing.T) {
	d := s.devs["vol-a"]
	const off, n = 1 << 20, 64 << 10
	pattern := alignedBuf(t, n)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>12)
	}
	fd := openDirect(t, d.Link, unix.O_RDWR)
	if _, err := unix.Pwrite(fd, pattern, off); err != nil {
		t.Fatalf("O_DIRECT write to %s: %v", d.Link, err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatalf("fsync %s: %v", d.Link, err)
	}
	back := alignedBuf(t, n)
	if _, err := unix.Pread(fd, back, off); err != nil || !slices.Equal(back, pattern) {
		t.Fatalf("O_DIRECT read back from %s: %v, equal %v", d.Link, err, slices.Equal(back, pattern))
	}
	file := s.volume(t, "vol-a", volSize).File
	got := make([]byte, n)
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, off); err != nil || !slices.Equal(got, pattern) {
		t.Fatalf("backing file %s does not hold the written data (%v)", file, err)
	}
}

func (s *suite) readOnly(t *testing.T) {
	req := s.volume(t, "vol-ro", volSize)
	req.ReadOnly = true
	d := s.mustAttach(t, "vol-ro", req)
	fd, err := unix.Open(d.Link, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return // refused at open: read-only
	}
	defer unix.Close(fd)
	buf := alignedBuf(t, 4096)
	if _, err := unix.Pwrite(fd, buf, 0); err == nil {
		t.Fatalf("write to read-only device %s succeeded", d.Link)
	}
}

func (s *suite) resize(t *testing.T) {
	d := s.devs["vol-a"]
	if err := os.Truncate(s.volume(t, "vol-a", volSize).File, grownSize); err != nil {
		t.Fatal(err)
	}
	err := s.b.Resize(context.Background(), d.VolumeID, grownSize)
	if errors.Is(err, blockdev.ErrNotSupported) && s.b.Name() == "ublk" {
		// Only a ublk driver without UPDATE_SIZE (before Linux 6.16)
		// cannot resize an attached device; loop always can.
		testgate.Skip(t, testgate.UpdateSize, "ublk cannot resize: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.waitList(t, func(devs []blockdev.Device) bool {
		i := slices.IndexFunc(devs, func(x blockdev.Device) bool { return x.VolumeID == d.VolumeID })
		return i >= 0 && devs[i].SizeBytes == grownSize
	}, "device size %d", grownSize)
}

func (s *suite) resizeUnknown(t *testing.T) {
	id := blockdev.VolumeID("never-attached")
	if err := s.b.Resize(context.Background(), id, volSize); !errors.Is(err, blockdev.ErrNotFound) {
		t.Fatalf("Resize of an unattached volume = %v, want ErrNotFound", err)
	}
}

func (s *suite) list(t *testing.T) {
	s.mustAttach(t, "vol-b", s.volume(t, "vol-b", volSize))
	s.waitList(t, func(devs []blockdev.Device) bool {
		return hasAll(devs, s.devs)
	}, "all %d attached devices", len(s.devs))
}

// listOther attaches a volume of another data directory, which must not show.
func (s *suite) listOther(t *testing.T) {
	other := &suite{dataDir: t.TempDir(), devs: map[string]blockdev.Device{}}
	other.b = s.newB(t, other.dataDir)
	t.Cleanup(other.detachAll(t))
	d := other.mustAttach(t, "vol-a", other.volume(t, "vol-a", volSize))
	devs, err := s.b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(devs, func(x blockdev.Device) bool { return x.Path == d.Path }) {
		t.Fatalf("List shows %s, which serves another data directory", d.Path)
	}
}

// readopt closes the backend and checks a new one finds every device.
func (s *suite) readopt(t *testing.T) {
	if err := s.b.Close(); err != nil {
		t.Fatal(err)
	}
	s.b = s.newB(t, s.dataDir)
	s.waitList(t, func(devs []blockdev.Device) bool { return hasAll(devs, s.devs) },
		"the %d devices made before Close", len(s.devs))
	before := s.devs["vol-a"]
	again := s.mustAttach(t, "vol-a", s.volume(t, "vol-a", grownSize))
	if again.Path != before.Path {
		t.Fatalf("Attach after re-adoption made %s, want the existing %s", again.Path, before.Path)
	}
}

func (s *suite) detachBusy(t *testing.T) {
	d := s.devs["vol-b"]
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := s.b.Detach(context.Background(), d.VolumeID); !errors.Is(err, blockdev.ErrBusy) {
		t.Fatalf("Detach of an exclusively open (mounted) device = %v, want ErrBusy", err)
	}
}

func (s *suite) detach(t *testing.T) {
	for name, d := range s.devs {
		if err := s.b.Detach(context.Background(), d.VolumeID); err != nil {
			t.Fatalf("Detach(%s): %v", name, err)
		}
		if _, err := os.Lstat(d.Link); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("link %s still there after Detach (%v)", d.Link, err)
		}
		if err := s.b.Detach(context.Background(), d.VolumeID); err != nil {
			t.Errorf("second Detach(%s) = %v, want nil", name, err)
		}
		delete(s.devs, name)
	}
	s.waitList(t, func(devs []blockdev.Device) bool { return len(devs) == 0 }, "no devices")
}

func (s *suite) detachUnknown(t *testing.T) {
	if err := s.b.Detach(context.Background(), blockdev.VolumeID("never-attached")); err != nil {
		t.Fatalf("Detach of an unknown volume = %v, want nil", err)
	}
}

// waitList polls List until ok accepts it or the deadline passes.
func (s *suite) waitList(t *testing.T, ok func([]blockdev.Device) bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	var devs []blockdev.Device
	var err error
	for time.Now().Before(deadline) {
		if devs, err = s.b.List(context.Background()); err == nil && ok(devs) {
			return
		}
		waitTick()
	}
	t.Fatalf("List = %+v, %v; want "+format, append([]any{devs, err}, args...)...)
}

func hasAll(devs []blockdev.Device, want map[string]blockdev.Device) bool {
	for _, w := range want {
		if !slices.ContainsFunc(devs, func(d blockdev.Device) bool { return d.VolumeID == w.VolumeID && d.Path == w.Path }) {
			return false
		}
	}
	return true
}

// waitTick blocks briefly between polls (a poll interval, not a sleep
// standing in for synchronisation: every wait has a deadline and a check).
func waitTick() { <-time.After(10 * time.Millisecond) }

// alignedBuf returns n bytes of page-aligned memory for O_DIRECT.
func alignedBuf(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func openDirect(t *testing.T, path string, mode int) int {
	t.Helper()
	fd, err := unix.Open(path, mode|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s O_DIRECT: %v", path, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}
