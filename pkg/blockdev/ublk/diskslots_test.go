package ublk

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestDiskSlotsFollowTheBackingDisk reads a server thread's share of a real
// disk's request slots: a file on an ext4 image on a loop device (one
// hardware queue) whose nr_requests the test sets, shared by two threads,
// gets half of what each thread's half of the queue is; a file on tmpfs,
// which has no request slots, gets no bound.
func TestDiskSlotsFollowTheBackingDisk(t *testing.T) {
	testgate.RequireRoot(t)
	dir := testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q")
	f, err := os.Create(filepath.Join(dir, "vol.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	nr := fmt.Sprintf("/sys/dev/block/%d:%d/queue/nr_requests", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(nr, []byte("32"), 0); err != nil {
		t.Fatalf("set %s: %v", nr, err)
	}
	for _, c := range []struct{ threads, want int }{{1, 16}, {2, 8}, {8, minDiskSlots}} {
		if got := diskSlots(int(f.Fd()), c.threads); got != c.want {
			t.Errorf("%d threads on a disk of 32 slots in one hardware queue: share %d, want %d", c.threads, got, c.want)
		}
	}
	tmp, err := os.Create(filepath.Join(testfs.MountTmpfs(t, 1<<20), "vol.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	if got := diskSlots(int(tmp.Fd()), 2); got != 0 {
		t.Errorf("a file on tmpfs: share %d, want 0 (no bound)", got)
	}
}
