package ublk

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// TestDifferentialHarnessAgreesWithItself runs the differential test's
// requests on two loop devices (direct I/O, 4 KiB blocks) of a 1 MiB and a
// 3 GiB file: the oracle against itself must find no difference, at queue
// depth 1 and in batches of 32, so that a difference the VM test reports is
// the server's, not the harness's (an order-dependent batch, a range drawn
// out of the device).
func TestDifferentialHarnessAgreesWithItself(t *testing.T) {
	testgate.RequireLoop(t)
	for _, size := range []int64{1 << 20, 3 << 30} {
		dir := t.TempDir()
		var pair [2]*os.File
		var files [2]string
		for i := range pair {
			files[i] = testfs.Sparse(t, filepath.Join(dir, string(rune('a'+i))+".img"), size)
			d, err := loop.Attach(files[i], loop.Options{DirectIO: true, BlockSize: 4096})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { loop.Detach(d.Path, 0) })
			if pair[i], err = os.OpenFile(d.Path, os.O_RDWR|unix.O_DIRECT, 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pair[i].Close() })
		}
		lim, err := readLimits(pair[0].Name(), size)
		if err != nil {
			t.Fatal(err)
		}
		for _, qd := range []int{1, 32} {
			tally, err := compareDevices(pair, lim, qd, 64, rand.New(rand.NewPCG(diffFixedSeed, uint64(qd))))
			if err != nil {
				t.Fatalf("%d-byte devices at depth %d: %v", size, qd, err)
			}
			t.Logf("%d-byte devices at depth %d agree: %v", size, qd, tally)
		}
		c, err := sameImages(files[0], files[1], size)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d-byte images equal: %v", size, c)
	}
}

// TestSameImagesFindsEveryDifference checks the image comparison: a byte
// that differs inside data, inside a hole of one file only (data against
// zeros), in a preallocated (unwritten) extent, and at the last byte is
// found at its offset, while equal images (a hole against written zeros,
// an unwritten extent against a hole) compare equal.
func TestSameImagesFindsEveryDifference(t *testing.T) {
	const size = 64 << 20
	dir := t.TempDir()
	write := func(path string, off int64, b []byte) {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if b != nil {
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	prealloc := func(path string, off, n int64) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	for _, c := range []struct {
		name string
		b    func(path string) // writes b; a holds data at 8 MiB
		diff int64             // -1: equal
	}{
		{"same", func(p string) { write(p, 8<<20, data) }, -1},
		{"zeros written over a hole", func(p string) { write(p, 8<<20, data); write(p, 40<<20, make([]byte, 1<<20)) }, -1},
		{"unwritten extent over a hole", func(p string) { write(p, 8<<20, data); prealloc(p, 20<<20, 16<<20) }, -1},
		{"a byte inside data", func(p string) {
			d := append([]byte(nil), data...)
			d[4097] ^= 1
			write(p, 8<<20, d)
		}, 8<<20 + 4097},
		{"data where the other has a hole", func(p string) { write(p, 8<<20, data); write(p, 30<<20+5, []byte{9}) }, 30<<20 + 5},
		{"data in an unwritten extent", func(p string) {
			write(p, 8<<20, data)
			prealloc(p, 20<<20, 16<<20)
			write(p, 35<<20, []byte{3})
		}, 35 << 20},
		{"the last byte", func(p string) { write(p, 8<<20, data); write(p, size-1, []byte{1}) }, size - 1},
	} {
		a, b := filepath.Join(dir, c.name+".a"), filepath.Join(dir, c.name+".b")
		write(a, 8<<20, data)
		c.b(b)
		_, err := sameImages(a, b, size)
		switch {
		case c.diff < 0 && err != nil:
			t.Errorf("%s: %v, want equal", c.name, err)
		case c.diff >= 0 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at byte %d ", c.diff))):
			t.Errorf("%s: %v, want a difference at byte %d", c.name, err, c.diff)
		}
		if _, err := sameImages(b, a, size); (err == nil) != (c.diff < 0) {
			t.Errorf("%s, the other way round: %v", c.name, err)
		}
	}
}
