package plugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestFullDiskPreallocated runs preallocated volumes (both modes) of the
// plugin binary on a data directory that then fills up: their first
// writes, into blocks never written, still succeed, since the blocks are
// theirs (a sparse volume's get ENOSPC, TestFullDisk), and a discard of
// their device is refused, so nothing gives the blocks back. With
// FASTBLK_TEST_BACKEND=ublk (the VM) it checks the ublk server, otherwise
// the kernel loop device.
func TestFullDiskPreallocated(t *testing.T) {
	testgate.RequireRoot(t)
	testgate.RequireTool(t, "blkdiscard")
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk")
	smallFS(t, disk, 128<<20)
	data := filepath.Join(disk, "data")
	p := launchOn(t, buildBinary(t), dir, data)
	const mib = 1 << 20
	type vol struct{ id, staging, target string }
	vols := map[string]vol{}
	for _, mode := range []string{"falloc", "full"} {
		id, staging, target := p.provisionAt(t, "pre-"+mode, 16*mib, capBlock, filepath.Join(dir, "staging-"+mode), mode,
			map[string]string{"preallocation": mode})
		vols[mode] = vol{id, staging, target}
	}
	n := fillUp(t, filepath.Join(disk, "filler"))
	t.Logf("the data directory's filesystem is full after %d MiB of filler", n>>20)

	for mode, v := range vols {
		mustIO(t, mode+": first write on a full disk", v.target, true, alignedBuf(t, mib, 0xd4), 8*mib, 0)
		mustIO(t, mode+": read back on a full disk", v.target, false, alignedBuf(t, mib, 0), 8*mib, 0xd4)
		mustIO(t, mode+": read of a part never written", v.target, false, alignedBuf(t, mib, 0xff), 12*mib, 0)
		if out, err := exec.Command("blkdiscard", "-f", v.target).CombinedOutput(); err == nil {
			t.Errorf("%s: blkdiscard of the device succeeded: %s", mode, out)
		}
		var st unix.Stat_t
		file := filepath.Join(data, "volumes", storeIDOf(v.id)+".img")
		if err := unix.Stat(file, &st); err != nil || st.Blocks*512 < 16*mib {
			t.Errorf("%s: backing file %d bytes allocated (%v), want 16 MiB", mode, st.Blocks*512, err)
		}
		mustIO(t, mode+": data kept after the discard", v.target, false, alignedBuf(t, mib, 0), 8*mib, 0xd4)
	}
	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		p.release(t, v.id, v.staging, v.target)
	}
}
