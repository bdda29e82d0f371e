package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestLastMountHolder covers the ublk server's self-deadlock: a process
// that exits while its mount namespace alone holds a mount of a ublk device
// it serves hangs in exit for good (mountinfo.MountDiesWithProcess). The
// plugin runs in a mount namespace of its own, as in a container.
//
// With the staging path on a private mount (a container without
// mountPropagation: Bidirectional), staging an ext4 volume is refused
// before anything is attached. With it on a mount shared with the test's
// namespace (what Bidirectional gives), staging works, the mount reaches
// the test's namespace, and a plugin killed with dirty data on the volume
// exits at once; the next plugin re-adopts the device and the volume is
// torn down cleanly.
func TestLastMountHolder(t *testing.T) {
	bin := requireVM(t)
	ctx := context.Background()

	t.Run("private", func(t *testing.T) {
		dir := workDir(t)
		p := &plugin{t: t, bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"), devDir: filepath.Join(dir, "dev"),
			sock: filepath.Join(dir, "csi.sock"), mountNS: true}
		p.start()
		t.Cleanup(p.stop)
		cr, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "mntns-private",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4")}})
		if err != nil {
			t.Fatal(err)
		}
		id := cr.GetVolume().GetVolumeId()
		staging := filepath.Join(dir, "staging")
		_, err = p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap("ext4")})
		t.Logf("NodeStageVolume on a private mount: %v", err)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "Bidirectional") {
			t.Fatalf("NodeStageVolume on a private mount in the plugin's own namespace: %v, want FailedPrecondition naming Bidirectional", err)
		}
		if devs := ublkDevices(t); len(devs) != 0 {
			t.Errorf("a refused NodeStageVolume left ublk devices %v", devs)
		}
		if _, err := p.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("shared", func(t *testing.T) {
		dir := workDir(t)
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		p := &plugin{t: t, bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"), devDir: filepath.Join(dir, "dev"),
			sock: filepath.Join(dir, "csi.sock"), mountNS: true}
		p.start()
		t.Cleanup(p.stop) // after provision's teardown, by the plugin running then
		v := p.provision("mntns-shared", 32<<20, mountCap("ext4"), nil)
		if !mountedHere(t, v.staging) {
			t.Fatalf("the staging mount made in the plugin's namespace did not reach the test's")
		}
		// Dirty data in the page cache of the volume's filesystem: an
		// unmount by the plugin's exit would have to write it.
		if err := os.WriteFile(filepath.Join(v.target, "dirty"), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		p.conn.Close()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := waitCmd(p.cmd, 30*time.Second); err != nil && !strings.Contains(err.Error(), "killed") {
			t.Fatalf("the plugin killed with a staged volume: %v", err)
		}
		t.Logf("the plugin in its own mount namespace exited %v after SIGKILL", time.Since(start).Round(time.Millisecond))
		p.cmd = nil
		// The next plugin, in the test's namespace, re-adopts the device;
		// provision's cleanup unpublishes, unstages and deletes.
		p.mountNS = false
		p.start()
		b, err := os.ReadFile(filepath.Join(v.target, "dirty"))
		if err != nil || len(b) != 1<<20 {
			t.Fatalf("the file written before the kill: %d bytes, %v", len(b), err)
		}
	})
}

// mountedHere reports whether path is a mount point in this process's
// mount namespace.
func mountedHere(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
