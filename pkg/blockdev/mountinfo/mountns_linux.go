package mountinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// A ublk server must never be the last holder of a mount of its own device.
// When a process exits, the kernel tears down its mount namespace if no
// other process is in it (do_exit, exit_task_namespaces), unmounting
// whatever is mounted there; an unmount that drops the last reference to a
// filesystem writes its dirty data and metadata back. If that filesystem is
// on a ublk device the exiting process serves, the writes wait for a server
// that is itself waiting in exit: its io_uring and /dev/ublkcN are
// released only later in do_exit (their final fput runs as task work), so
// the device is not even handed over to user recovery. The process stays
// in D state for good, the device with it.
//
// The plugin mounts a volume's filesystem at the staging path. With the
// kubelet directory given to the plugin's container with
// mountPropagation: Bidirectional, the staging mount propagates to the
// host's mount namespace, which keeps it (and the filesystem) when the
// plugin's namespace goes. Without it, or when the plugin runs in a mount
// namespace of its own whose mounts are private, the plugin's namespace
// holds the only mount: MountDiesWithProcess says so before anything is
// mounted, and the driver refuses to stage such a ublk volume.

// MountDiesWithProcess reports whether a mount made at path now would be
// held by this process alone: the mount containing path is not shared
// (a mount beneath it would not propagate to another namespace), and no
// other process is in this process's mount namespace. The reason says
// which mount and namespace, for the error.
func MountDiesWithProcess(path string) (bool, string, error) {
	mounts, err := Mounts()
	if err != nil {
		return false, "", err
	}
	m, ok := ContainingMount(mounts, path)
	if !ok {
		return false, "", fmt.Errorf("no mount contains %s: %w", path, blockdev.ErrInvalid)
	}
	if m.Shared {
		return false, "", nil
	}
	alone, ns, err := AloneInMountNamespace()
	if err != nil || !alone {
		return false, "", err
	}
	return true, fmt.Sprintf("%s is on the private mount %s and this process is alone in mount namespace %s", path, m.MountPoint, ns), nil
}

// ContainingMount returns the mount that holds path: the topmost mount
// (the last in the table) whose mount point is path or its closest
// ancestor.
func ContainingMount(mounts []MountInfo, path string) (MountInfo, bool) {
	path = filepath.Clean(path)
	var best MountInfo
	found := false
	for _, m := range mounts {
		mp := filepath.Clean(m.MountPoint)
		if mp != path && mp != "/" && !strings.HasPrefix(path, mp+"/") {
			continue
		}
		if !found || len(mp) >= len(filepath.Clean(best.MountPoint)) {
			best, found = m, true
		}
	}
	return best, found
}

// procDir is where AloneInMountNamespace looks for processes.
var procDir = "/proc"

// AloneInMountNamespace reports whether no other process visible in /proc
// is in this process's mount namespace, and names the namespace.
func AloneInMountNamespace() (bool, string, error) {
	self, err := os.Readlink(filepath.Join(procDir, "self", "ns", "mnt"))
	if err != nil {
		return false, "", fmt.Errorf("mount namespace: %w", err)
	}
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return false, "", fmt.Errorf("list processes: %w", err)
	}
	me := fmt.Sprint(os.Getpid())
	for _, e := range ents {
		name := e.Name()
		if name == me || name[0] < '0' || name[0] > '9' {
			continue
		}
		ns, err := os.Readlink(filepath.Join(procDir, name, "ns", "mnt"))
		if err == nil && ns == self {
			return false, self, nil
		}
	}
	return true, self, nil
}
