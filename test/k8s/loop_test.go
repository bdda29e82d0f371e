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
// under dir, matched by device and inode: the paths the kernel reports are
// the nodes' /var/lib/csi-fastblk, the same string on both nodes.
func loopDevicesUnder(t *testing.T, dir string) []string {
	t.Helper()
	files := map[fileID]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				files[fileID{st.Dev, st.Ino}] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-l", "-n", "-O", "NAME,BACK-INO,BACK-MAJ:MIN").Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	var devs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		ino, err1 := strconv.ParseUint(f[1], 10, 64)
		majMin := strings.SplitN(f[2], ":", 2)
		if err1 != nil || len(majMin) != 2 {
			continue
		}
		maj, _ := strconv.ParseUint(majMin[0], 10, 32)
		minor, _ := strconv.ParseUint(majMin[1], 10, 32)
		// st_dev is the kernel's new_encode_dev of the device number.
		dev := (minor & 0xff) | (maj << 8) | ((minor &^ 0xff) << 12)
		if files[fileID{dev, ino}] {
			devs = append(devs, f[0])
		}
	}
	return devs
}

// staleLoopDevices lists loop devices attached to a deleted volume file of
// a node: the kernel shows it as /volumes/<id>.img (deleted), relative to
// the node's data directory mount, on the filesystem of dir. Devices that
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
		majMin := strings.SplitN(rest[0], ":", 2)
		if len(majMin) != 2 {
			continue
		}
		maj, _ := strconv.ParseUint(majMin[0], 10, 32)
		minor, _ := strconv.ParseUint(majMin[1], 10, 32)
		if (minor&0xff)|(maj<<8)|((minor&^0xff)<<12) == st.Dev && !before[f[0]] {
			devs = append(devs, f[0]+" "+strings.TrimSpace(rest[1]))
		}
	}
	return devs
}
