package loop

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
)

func requireRoot(t *testing.T) {
	t.Helper()
	testgate.RequireLoop(t)
}

func sparseFile(t *testing.T, size int64) string {
	t.Helper()
	return testfs.Sparse(t, filepath.Join(t.TempDir(), "backing.img"), size)
}

func attach(t *testing.T, file string, opts Options) Device {
	t.Helper()
	d, err := Attach(file, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Detach(d.Path, 10*time.Second); err != nil {
			t.Error(err)
		}
	})
	return d
}

func TestAttach(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"direct-4k", Options{DirectIO: true, BlockSize: 4096}},
		{"buffered-512", Options{}},
		{"read-only", Options{ReadOnly: true, DirectIO: true, BlockSize: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := sparseFile(t, 8<<20)
			d := attach(t, file, tc.opts)
			want := max(int(tc.opts.BlockSize), 512)
			if d.BackingFile != file || d.SizeBytes != 8<<20 || d.BlockSize != want || d.ReadOnly != tc.opts.ReadOnly {
				t.Fatalf("device %+v, want backing %s, 8 MiB, block size %d, ro %v", d, file, want, tc.opts.ReadOnly)
			}
			if d.DirectIO != tc.opts.DirectIO {
				t.Errorf("direct I/O = %v, want %v", d.DirectIO, tc.opts.DirectIO)
			}
			found, err := Find(file)
			if err != nil || len(found) != 1 || found[0].Path != d.Path {
				t.Fatalf("Find(%s) = %+v, %v; want [%s]", file, found, err, d.Path)
			}
		})
	}
}

func TestSetCapacity(t *testing.T) {
	requireRoot(t)
	file := sparseFile(t, 8<<20)
	d := attach(t, file, Options{DirectIO: true, BlockSize: 4096})
	if err := os.Truncate(file, 24<<20); err != nil {
		t.Fatal(err)
	}
	size, err := SetCapacity(d.Path)
	if err != nil || size != 24<<20 {
		t.Fatalf("SetCapacity = %d, %v; want %d", size, err, 24<<20)
	}
}

func TestDetach(t *testing.T) {
	requireRoot(t)
	file := sparseFile(t, 8<<20)
	d, err := Attach(file, Options{DirectIO: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("busy", func(t *testing.T) {
		fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := Detach(d.Path, time.Second); !errors.Is(err, unix.EBUSY) {
			t.Fatalf("Detach of an exclusively open device = %v, want EBUSY", err)
		}
	})
	t.Run("bound", func(t *testing.T) {
		if err := Detach(d.Path, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if found, _ := Find(file); len(found) != 0 {
			t.Fatalf("still bound: %+v", found)
		}
	})
	t.Run("unbound", func(t *testing.T) {
		if err := Detach(d.Path, time.Second); err != nil {
			t.Fatalf("second Detach = %v, want nil", err)
		}
	})
	t.Run("not-a-loop", func(t *testing.T) {
		if err := Detach("/dev/null", time.Second); err == nil {
			t.Fatal("Detach(/dev/null) succeeded")
		}
	})
}

func TestConcurrentAttach(t *testing.T) {
	requireRoot(t)
	const n = 6
	type result struct {
		d   Device
		err error
	}
	results := make(chan result, n)
	for range n {
		file := sparseFile(t, 4<<20)
		go func() {
			d, err := Attach(file, Options{DirectIO: true, BlockSize: 4096})
			results <- result{d, err}
		}()
	}
	seen := map[string]bool{}
	for range n {
		r := <-results
		d, err := r.d, r.err
		if err != nil {
			t.Error(err)
			continue
		}
		t.Cleanup(func() { Detach(d.Path, 10*time.Second) })
		if seen[d.Path] {
			t.Errorf("%s handed out twice", d.Path)
		}
		seen[d.Path] = true
	}
}

func TestDeletedBackingFile(t *testing.T) {
	requireRoot(t)
	file := sparseFile(t, 4<<20)
	d, err := Attach(file, Options{DirectIO: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	found, err := Find(file)
	if err != nil || len(found) != 1 || !found[0].Deleted || found[0].Path != d.Path {
		t.Fatalf("Find after delete = %+v, %v; want %s marked deleted", found, err, d.Path)
	}
	if err := Detach(d.Path, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestAttachStartsWithZeroCounters: the kernel keeps a loop device's I/O
// counters across detach and re-attach, so Attach must give each file a
// device whose counters start at zero, or a new volume's metrics would
// count the I/O of the volumes before it; Detach removes the device.
func TestAttachStartsWithZeroCounters(t *testing.T) {
	requireRoot(t)
	first := attach(t, sparseFile(t, 8<<20), Options{}) // its cleanup's Detach finds it gone
	f, err := os.OpenFile(first.Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if w := writtenSectors(t, first.Number); w == 0 {
		t.Fatalf("%s counts no written sectors after 1 MiB", first.Path)
	}
	if err := Detach(first.Path, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sysPath(first.Number, "")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after Detach (%v), want it removed", first.Path, err)
	}
	second := attach(t, sparseFile(t, 8<<20), Options{})
	if w := writtenSectors(t, second.Number); w != 0 {
		t.Errorf("a new attach (%s, after %s) starts with %d written sectors, want 0", second.Path, first.Path, w)
	}
}

// writtenSectors is field 7 of /sys/block/loopN/stat.
func writtenSectors(t *testing.T, n int) uint64 {
	t.Helper()
	b, err := os.ReadFile(sysPath(n, "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 7 {
		t.Fatalf("stat of loop%d: %q", n, b)
	}
	w, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
