package ublk

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestServerLargeRequestsArriveWhole writes and reads 1 MiB blocks with
// O_DIRECT, one at a time, through a device of the default configuration
// (zero copy where the kernel has AUTO_BUF_REG, else user copy) and of
// user copy where both exist, and checks from the server's own counters
// that each block reached it as one request of 1 MiB, not as the 128 KiB
// pieces of copy mode, and that the data came back.
func TestServerLargeRequestsArriveWhole(t *testing.T) {
	f := needUblk(t)
	if f&FlagUserCopy == 0 {
		testgate.Without(t, testgate.UserCopy, "kernel has no USER_COPY: large requests need zero copy")
	}
	configs := map[string]ServerConfig{"default": {}}
	if f&(FlagUserCopy|FlagAutoBufReg) == FlagUserCopy|FlagAutoBufReg {
		configs["user copy"] = ServerConfig{ZeroCopy: ModeOff}
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			dir := scratchDir(t)
			cfg.StateDir = filepath.Join(dir, "state")
			file := sparseFile(t, dir, "vol.img", 128<<20)
			ctx := context.Background()
			s, errs, err := NewServer(ctx, cfg)
			if err != nil || len(errs) != 0 {
				t.Fatalf("start: %v, %v", err, errs)
			}
			defer s.Close()
			d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Detach(ctx, "vol")
			t.Logf("%s: %s, %d-byte requests, flags %s", d.Path, d.Tuning.CopyMode(), d.Tuning.MaxIOBytes, FormatFlags(d.Flags))
			if d.Tuning.MaxIOBytes != 1<<20 || maxSectorsKB(t, d.Path) != 1024 {
				t.Fatalf("device takes %d-byte requests (kernel: %d KiB), want 1 MiB", d.Tuning.MaxIOBytes, maxSectorsKB(t, d.Path))
			}
			const blocks = 32
			before, _, _ := s.Stats("vol")
			ioBlocks(t, d.Path, blocks, 1<<20)
			after, _, _ := s.Stats("vol")
			if w, r := after.Writes-before.Writes, after.Reads-before.Reads; w != blocks || r != blocks ||
				after.BytesWritten-before.BytesWritten != blocks<<20 || after.BytesRead-before.BytesRead != blocks<<20 {
				t.Fatalf("%d blocks of 1 MiB written and read in %d writes of %d bytes and %d reads of %d bytes, want one request each",
					blocks, w, after.BytesWritten-before.BytesWritten, r, after.BytesRead-before.BytesRead)
			}
			if d.Tuning.UserCopy && after.CopyOffloads-before.CopyOffloads != 2*blocks {
				t.Errorf("user copy: %d of %d requests copied off the server thread", after.CopyOffloads-before.CopyOffloads, 2*blocks)
			}
		})
	}
}

// ioBlocks writes n blocks of size bytes at the start of dev with O_DIRECT,
// one at a time, then reads them back and compares.
func ioBlocks(t *testing.T, dev string, n int, size int) {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dev, err)
	}
	defer unix.Close(fd)
	want, got := alignedBuf(t, size), alignedBuf(t, size)
	for i := range n {
		fill(want, byte(i))
		if w, err := unix.Pwrite(fd, want, int64(i*size)); err != nil || w != size {
			t.Fatalf("write block %d of %s: %d, %v", i, dev, w, err)
		}
		if r, err := unix.Pread(fd, got, int64(i*size)); err != nil || r != size || !slices.Equal(got, want) {
			t.Fatalf("read block %d of %s: %d, %v, equal %v", i, dev, r, err, slices.Equal(got, want))
		}
	}
}
