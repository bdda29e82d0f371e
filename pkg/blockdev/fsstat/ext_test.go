package fsstat

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// TestReadExtSize formats image files larger than their filesystems with
// the real mke2fs and reads back the size it made.
func TestReadExtSize(t *testing.T) {
	testgate.RequireTool(t, "mkfs.ext4")
	for _, tc := range []struct {
		name string
		args []string
		want ExtSize
	}{
		{"ext4 1 KiB blocks", []string{"-t", "ext4", "-b", "1024"}, ExtSize{BlockSize: 1024, Blocks: 20 << 10}},
		{"ext4 4 KiB blocks", []string{"-t", "ext4", "-b", "4096"}, ExtSize{BlockSize: 4096, Blocks: 5 << 10}},
		{"ext4 64bit", []string{"-t", "ext4", "-b", "4096", "-O", "64bit"}, ExtSize{BlockSize: 4096, Blocks: 5 << 10}},
		{"ext2", []string{"-t", "ext2", "-b", "4096"}, ExtSize{BlockSize: 4096, Blocks: 5 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "fs.img")
			if err := os.WriteFile(img, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(img, 64<<20); err != nil {
				t.Fatal(err)
			}
			testfs.Run(t, "mke2fs", append(append([]string{"-q", "-F"}, tc.args...), img, "20M")...)
			got, err := ReadExtSize(img)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || got.Bytes() != 20<<20 {
				t.Errorf("ReadExtSize = %+v (%d bytes), want %+v (20 MiB)", got, got.Bytes(), tc.want)
			}
		})
	}
}

// TestReadExtSizeNoExt reads files holding no ext filesystem: zeros, less
// than a superblock, and a real xfs.
func TestReadExtSizeNoExt(t *testing.T) {
	testgate.RequireTool(t, "mkfs.xfs")
	dir := t.TempDir()
	zeros := filepath.Join(dir, "zeros")
	if err := os.WriteFile(zeros, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, make([]byte, 1500), 0o600); err != nil {
		t.Fatal(err)
	}
	xfs := filepath.Join(dir, "xfs")
	if err := os.WriteFile(xfs, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(xfs, 320<<20); err != nil {
		t.Fatal(err)
	}
	testfs.Run(t, "mkfs.xfs", "-q", xfs)
	for _, p := range []string{zeros, short, xfs} {
		if _, err := ReadExtSize(p); !errors.Is(err, blockdev.ErrNotFound) {
			t.Errorf("ReadExtSize(%s) = %v, want ErrNotFound", filepath.Base(p), err)
		}
	}
	if _, err := ReadExtSize(filepath.Join(dir, "missing")); err == nil || errors.Is(err, blockdev.ErrNotFound) {
		t.Errorf("ReadExtSize of a missing file = %v, want an open error", err)
	}
}
