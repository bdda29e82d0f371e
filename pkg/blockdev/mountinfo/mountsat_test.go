package mountinfo_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/mountinfo"
)

func TestMountsAt(t *testing.T) {
	dir := testfs.MountTmpfs(t, 1<<20)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	plain, gone := t.TempDir(), filepath.Join(t.TempDir(), "gone")
	got, err := mountinfo.MountsAt(dir, link, plain, gone, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, link} {
		if m, ok := got[p]; !ok || m.FsType != "tmpfs" || m.MountPoint != dir {
			t.Errorf("MountsAt[%s] = %+v, %v; want the tmpfs at %s", p, m, ok, dir)
		}
	}
	if len(got) != 2 {
		t.Errorf("MountsAt = %v; want only %s and %s", got, dir, link)
	}
}
