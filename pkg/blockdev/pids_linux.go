package blockdev

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupRoot is where the cgroup filesystems are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// PidsLimit returns the most tasks (processes and threads) the pids
// controller lets process pid's cgroup hold: the smallest pids.max of its
// cgroup and every ancestor, under cgroup v2 or v1's pids hierarchy. -1
// means no limit (or no pids controller). Every ublk queue is a thread of
// this process, so the limit bounds how many volumes the node can serve.
func PidsLimit(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, fmt.Errorf("pids limit: %w", err)
	}
	defer f.Close()
	limit := int64(-1)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir = CgroupRoot // v2
			if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err != nil {
				dir = filepath.Join(CgroupRoot, "unified") // v1/v2 hybrid
			}
		case hasController(parts[1], "pids"):
			dir = filepath.Join(CgroupRoot, "pids")
		default:
			continue
		}
		l, err := minPidsMax(dir, parts[2])
		if err != nil {
			return 0, fmt.Errorf("pids limit: %w", err)
		}
		limit = tighter(limit, l)
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("pids limit: %w", err)
	}
	return limit, nil
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// minPidsMax is the smallest pids.max from cgroup rel under root up to
// root itself; -1 when none sets one.
func minPidsMax(root, rel string) (int64, error) {
	limit := int64(-1)
	for p := path.Clean("/" + rel); ; p = path.Dir(p) {
		l, err := readPidsMax(filepath.Join(root, p, "pids.max"))
		if err != nil {
			return 0, err
		}
		limit = tighter(limit, l)
		if p == "/" {
			return limit, nil
		}
	}
}

// tighter is the smaller of two limits, where -1 means none.
func tighter(a, b int64) int64 {
	if a < 0 || (b >= 0 && b < a) {
		return b
	}
	return a
}

// readPidsMax reads one pids.max: a number, "max", or no file (the root
// cgroup, or a cgroup without the controller), which is no limit (-1).
func readPidsMax(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", file, s, err)
	}
	return n, nil
}
