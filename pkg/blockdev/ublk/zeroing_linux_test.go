package ublk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// TestServerZeroesLargeRangesAsLoopDoes runs the zeroing requests of a
// large volume's life (blkdiscard of the whole device, BLKZEROOUT of 3 GiB,
// a punch and a zero range of 3 GiB through fallocate, as mkfs and fstrim
// send them) on an 8 GiB device of the server and on an 8 GiB loop device
// (direct I/O) over sparse files of the same filesystem. Each request must
// have the same outcome on both, the blocks around each range must read the
// same, and the server must count no I/O error. Before, every request of
// 2 GiB or more failed on the server with EIO.
func TestServerZeroesLargeRangesAsLoopDoes(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	ctx := context.Background()
	const size = 8 << 30
	sparse := func(name string) string { return testfs.Sparse(t, filepath.Join(dir, name), size) }
	s := newTestServer(t, filepath.Join(dir, "state"))
	defer s.Close()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "large", File: sparse("ublk.img")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Detach(ctx, "large"); err != nil {
			t.Errorf("detach: %v", err)
		}
	}()
	ld, err := loop.Attach(sparse("loop.img"), loop.Options{DirectIO: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(ld.Path, 0)

	devs := map[string]*os.File{}
	for name, path := range map[string]string{"ublk": d.Path, "loop": ld.Path} {
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		devs[name] = f
	}
	// Blocks on both sides of every range's ends, and the device's last.
	probes := []int64{0, 3<<30 - 4096, 3 << 30, 4<<30 - 4096, 4 << 30, size - 4096}
	mark := alignedBuf(t, 4096)
	got := alignedBuf(t, 4096)
	ops := []struct {
		name string
		do   func(f *os.File) error
	}{
		{"BLKZEROOUT 3GiB", func(f *os.File) error { return ioctlRange(f, unix.BLKZEROOUT, &[2]uint64{0, 3 << 30}) }},
		{"punch 3GiB from 4KiB", func(f *os.File) error {
			return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 3<<30)
		}},
		{"zero range 3GiB from 1GiB", func(f *os.File) error {
			return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 1<<30, 3<<30)
		}},
		{"BLKDISCARD whole device", func(f *os.File) error { return ioctlRange(f, unix.BLKDISCARD, &[2]uint64{0, size}) }},
	}
	// One device at a time, each emptied by a whole-device discard after
	// its turn: a zeroing without unmap allocates its range, and both at
	// once would not fit the VM's data disk.
	wipe := func(name string) {
		if err := ioctlRange(devs[name], unix.BLKDISCARD, &[2]uint64{0, size}); err != nil {
			t.Fatalf("%s: discard the whole device: %v", name, err)
		}
	}
	for _, op := range ops {
		outcome := map[string]error{}
		blocks := map[string][][]byte{}
		for _, name := range []string{"loop", "ublk"} {
			f := devs[name]
			for i, at := range probes {
				fill(mark, byte(i+1))
				if _, err := f.WriteAt(mark, at); err != nil {
					t.Fatalf("%s: write at %d: %v", name, at, err)
				}
			}
			outcome[name] = op.do(f)
			for _, at := range probes {
				if _, err := f.ReadAt(got, at); err != nil {
					t.Fatalf("%s: read at %d after %s: %v", name, at, op.name, err)
				}
				blocks[name] = append(blocks[name], bytes.Clone(got))
			}
			wipe(name)
		}
		if !errors.Is(outcome["ublk"], outcome["loop"]) {
			t.Errorf("%s: loop answers %v, the server %v", op.name, outcome["loop"], outcome["ublk"])
		}
		for i, at := range probes {
			if !bytes.Equal(blocks["ublk"][i], blocks["loop"][i]) {
				t.Errorf("%s: block at %d differs from loop's", op.name, at)
			}
		}
	}
	if st, _, _ := s.Stats("large"); st.Errors != 0 {
		t.Errorf("the server counted %d I/O errors", st.Errors)
	}
}
