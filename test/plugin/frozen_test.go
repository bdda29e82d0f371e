package plugin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// FIFREEZE and FITHAW (include/uapi/linux/fs.h).
const fiFreeze, fiThaw = 0xc0045877, 0xc0045878

// frozen reports whether the filesystem mounted at dir is frozen, without
// blocking: FIFREEZE of a frozen filesystem fails with EBUSY (one that is
// not is frozen and thawed at once). dir must be the volume's mount point.
func frozen(t *testing.T, dir string) bool {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_, err = unix.IoctlRetInt(fd, fiFreeze)
	if errors.Is(err, unix.EBUSY) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.IoctlRetInt(fd, fiThaw); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestKilledWhileFrozenThawsAtStart kills the plugin binary (built with the
// failpoint tag, which stops it once the source's filesystem is frozen) in
// the middle of CreateSnapshot of a mounted volume, starts the plugin again
// on the same data directory, and proves the filesystem is thawed, the pod
// can write, and the half-made snapshot is gone.
func TestKilledWhileFrozenThawsAtStart(t *testing.T) {
	testgate.RequireRoot(t)
	bin, dir := buildBinary(t, "failpoint"), t.TempDir()
	p := launch(t, bin, dir, "FASTBLK_FAILPOINT=frozen")
	capMount := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	id, staging, target := p.provision(t, "frozen-vol", 64<<20, capMount, "mnt")
	t.Cleanup(func() {
		// Never leave the host with a frozen mount. Thaw only: by now
		// staging may be a plain directory of the host's filesystem,
		// which FIFREEZE must not touch; FITHAW of a filesystem that is
		// not frozen is EINVAL and harmless.
		if fd, err := unix.Open(staging, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			unix.IoctlRetInt(fd, fiThaw)
			unix.Close(fd)
		}
		if !t.Failed() {
			return
		}
		// The test stopped half-way: undo what the plugin left.
		unix.Unmount(target, 0)
		unix.Unmount(staging, 0)
		storeID, _, _ := strings.Cut(id, "-") // the CSI ID without its node tag
		file := filepath.Join(dir, "data", "volumes", storeID+".img")
		out, _ := exec.Command("losetup", "-j", file).Output()
		if dev, _, ok := strings.Cut(string(out), ":"); ok {
			exec.Command("losetup", "-d", dev).Run()
		}
	})

	ctx, ctrl := context.Background(), csi.NewControllerClient(p.conn)
	snapErr := make(chan error, 1)
	go func() {
		_, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "frozen-snap", SourceVolumeId: id})
		snapErr <- err
	}()
	waitFor(t, "the plugin to stop at its failpoint", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "plugin.log"))
		return strings.Contains(string(b), "failpoint frozen")
	})
	p.cmd.Process.Kill()
	<-p.exited
	<-snapErr
	if !frozen(t, staging) {
		t.Fatal("the filesystem is not frozen after the kill: the test missed its window")
	}

	p = launch(t, bin, dir) // no failpoint: the plugin as it starts after a crash
	ctrl = csi.NewControllerClient(p.conn)
	if frozen(t, staging) {
		t.Fatal("the filesystem is still frozen after the plugin started again: every write of the pod hangs")
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(target, "after"), []byte("ok"), 0o600) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write into the volume hangs after the restart")
	}
	snaps, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(snaps.GetEntries()) != 0 {
		t.Errorf("snapshots after the crash: %v, %v; want none", snaps.GetEntries(), err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "plugin.log")); !strings.Contains(string(b), "thawed a filesystem a previous run left frozen") {
		t.Error("the restarted plugin did not log the thaw")
	}
	p.release(t, id, staging, target)
}
