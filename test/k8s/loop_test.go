package k8s

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// fileID is a file's device and inode number.
type fileID struct{ dev, ino uint64 }

// loopDevicesUnder lists the loop devices whose backing file is a file
// under dir, matched by device and inode (the paths the kernel reports are
// the nodes' /var/lib/csi-fastblk, the same string on both nodes), and the
// loop devices whose backing file is on a node's device-class disk (node.sh:
// <node>/disks/, whose own loop devices are the harness's, not listed).
func loopDevicesUnder(t *testing.T, dir string) []string {
	t.Helper()
	files, disks := map[fileID]bool{}, map[fileID]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				if filepath.Base(filepath.Dir(path)) == "disks" {
					disks[fileID{st.Dev, st.Ino}] = true
				} else {
					files[fileID{st.Dev, st.Ino}] = true
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	devs := loopDevices(t)
	onDisk := map[uint64]bool{} // st_dev of the device-class disks
	for _, d := range devs {
		if disks[d.backing] {
			onDisk[d.dev] = true
		}
	}
	var out []string
	for _, d := range devs {
		if files[d.backing] || onDisk[d.backing.dev] {
			out = append(out, d.name)
		}
	}
	return out
}

// loopDevice is a loop device: its name, its own device number and its
// backing file's, as st_dev has them.
type loopDevice struct {
	name    string
	dev     uint64
	backing fileID
}

func loopDevices(t *testing.T) []loopDevice {
	t.Helper()
	out, err := exec.Command("losetup", "-l", "-n", "-O", "NAME,MAJ:MIN,BACK-INO,BACK-MAJ:MIN").Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	var devs []loopDevice
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		ino, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			continue
		}
		devs = append(devs, loopDevice{name: f[0], dev: devNumber(f[1]), backing: fileID{devNumber(f[3]), ino}})
	}
	return devs
}

// devNumber is "MAJ:MIN" as st_dev has it: the kernel's new_encode_dev.
func devNumber(majMin string) uint64 {
	a, b, _ := strings.Cut(majMin, ":")
	maj, _ := strconv.ParseUint(a, 10, 32)
	minor, _ := strconv.ParseUint(b, 10, 32)
	return (minor & 0xff) | (maj << 8) | ((minor &^ 0xff) << 12)
}

// staleLoopDevices lists loop devices attached to a deleted volume file of
// a node: the kernel shows it as /volumes/<id>.img (deleted), relative to
// the node's data directory (or device class) mount, on the filesystem of
// dir or of a device-class disk (a loop device over a file on it). Devices that
// were there before the cluster started (dir/loop.before, written by
// cluster.sh up) are not this run's.
func staleLoopDevices(t *testing.T, dir string) []string {
	t.Helper()
	before := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "loop.before")); err == nil {
		for _, name := range strings.Fields(string(b)) {
			before[name] = true
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	fss := map[uint64]bool{st.Dev: true} // and the device-class disks'
	for _, d := range loopDevices(t) {
		if d.backing.dev == st.Dev {
			fss[d.dev] = true
		}
	}
	out, err := exec.Command("losetup", "-l", "-n", "-O", "NAME,BACK-MAJ:MIN,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	deleted := regexp.MustCompile(`^/volumes/v[0-9a-f]+\.img \(deleted\)$`)
	var devs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.SplitN(strings.TrimSpace(l), " ", 2)
		if len(f) != 2 {
			continue
		}
		rest := strings.SplitN(strings.TrimSpace(f[1]), " ", 2)
		if len(rest) != 2 || !deleted.MatchString(strings.TrimSpace(rest[1])) {
			continue
		}
		if fss[devNumber(rest[0])] && !before[f[0]] {
			devs = append(devs, f[0]+" "+strings.TrimSpace(rest[1]))
		}
	}
	return devs
}
