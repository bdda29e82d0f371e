package mountinfo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

func TestParseMountLineShared(t *testing.T) {
	for line, want := range map[string]bool{
		"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw":          false,
		"36 35 98:0 /mnt1 /mnt2 rw,noatime shared:7 master:1 - ext3 /dev/root rw": true,
		"36 35 98:0 / /mnt2 rw shared:12 - ext4 /dev/vda rw":                      true,
		"36 35 98:0 / /mnt2 rw - ext4 /dev/vda rw":                                false,
	} {
		m, err := parseMountLine(line)
		if err != nil {
			t.Fatal(err)
		}
		if m.Shared != want {
			t.Errorf("%q: Shared = %v, want %v", line, m.Shared, want)
		}
	}
}

func TestContainingMount(t *testing.T) {
	mounts := []MountInfo{{MountPoint: "/"}, {MountPoint: "/var/lib"}, {MountPoint: "/var/lib/kubelet", Shared: true},
		{MountPoint: "/var/lib/kube"}, {MountPoint: "/var/lib/kubelet", FsType: "top", Shared: true}}
	for path, want := range map[string]string{
		"/var/lib/kubelet/plugins/x/staging": "/var/lib/kubelet",
		"/var/lib/kubelet":                   "/var/lib/kubelet",
		"/var/lib/kubeletx/a":                "/var/lib",
		"/etc":                               "/",
	} {
		m, ok := ContainingMount(mounts, path)
		if !ok || m.MountPoint != want {
			t.Errorf("ContainingMount(%s) = %q, %v; want %q", path, m.MountPoint, ok, want)
		}
	}
	if m, _ := ContainingMount(mounts, "/var/lib/kubelet/x"); m.FsType != "top" {
		t.Errorf("ContainingMount did not take the topmost of two mounts at one point")
	}
}

// TestMountDiesWithProcess runs a child in a mount namespace of its own
// (as a container runs the plugin): a mount under a private mount there
// would die with it, one under a mount shared with this namespace (as
// mountPropagation: Bidirectional gives the kubelet directory) would not;
// this test's own process shares its namespace with others, so nothing
// it mounts dies with it.
func TestMountDiesWithProcess(t *testing.T) {
	if os.Getenv("FASTBLK_MOUNTNS_HELPER") != "" {
		dies, why, err := MountDiesWithProcess(os.Getenv("FASTBLK_MOUNTNS_PATH"))
		fmt.Printf("dies=%v err=%v why=%s\n", dies, err, why)
		return
	}
	testgate.RequireRoot(t)
	if dies, why, err := MountDiesWithProcess(t.TempDir()); err != nil || dies {
		t.Errorf("in the test's namespace: dies %v (%s), %v; want false: other processes share it", dies, why, err)
	}
	// A child in a mount namespace of its own takes a copy of every mount
	// there is, those of test packages running beside this one included,
	// and keeps their devices busy while it lives (under `go test ./...`
	// the driver's tests then failed to detach their loop devices). So the
	// rest runs where nothing else mounts: in the VM, step 41.
	if os.Getenv("FASTBLK_EXCLUSIVE_MOUNTS") == "" {
		testgate.Skip(t, testgate.ExclusiveMounts, "the mount namespace half needs a machine where no other test mounts at the same time (FASTBLK_EXCLUSIVE_MOUNTS=1; the VM's step 41 sets it)")
	}
	private := t.TempDir()
	shared := t.TempDir()
	if err := unix.Mount(shared, shared, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(shared, unix.MNT_DETACH) })
	if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(private, "staging"): "dies=true err=<nil>",
		filepath.Join(shared, "staging"):  "dies=false err=<nil>",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMountDiesWithProcess$")
		cmd.Env = append(os.Environ(), "FASTBLK_MOUNTNS_HELPER=1", "FASTBLK_MOUNTNS_PATH="+path)
		// Cloneflags, not Unshareflags: Go then keeps the propagation
		// of the copied mounts, as a container runtime does.
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("%s in a mount namespace of its own: %s, want %s", path, out, want)
		}
	}
}
