package blkdev

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func TestDeviceNumber(t *testing.T) {
	t.Run("not a block device", func(t *testing.T) {
		if _, _, err := Number(t.TempDir()); !errors.Is(err, blockdev.ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, _, err := Number(filepath.Join(t.TempDir(), "gone")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v, want ErrNotExist", err)
		}
	})
	t.Run("block device matches its mount", func(t *testing.T) {
		m := testfs.MountedExt4(t)
		major, minor, err := Number(m.Source)
		if err != nil {
			t.Fatal(err)
		}
		if major != m.Major || minor != m.Minor {
			t.Fatalf("%s is %d:%d, mount table says %d:%d", m.Source, major, minor, m.Major, m.Minor)
		}
	})
}
