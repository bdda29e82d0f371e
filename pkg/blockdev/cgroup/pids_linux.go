package cgroup

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

// Root is where the cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// PidsLimit returns the most tasks (processes and threads) the pids
// controller lets process pid's cgroup hold: the smallest pids.max of its
// cgroup and every ancestor, under cgroup v2 or v1's pids hierarchy. -1
// means no limit (or no pids controller). Every ublk queue is a thread of
// this process, so the limit bounds how many volumes the node can serve.
func PidsLimit(pid int) (int64, error) {
	levels, err := pidsLevels(pid)
	if err != nil {
		return 0, fmt.Errorf("pids limit: %w", err)
	}
	limit := int64(-1)
	for _, l := range levels {
		limit = tighter(limit, l.max)
	}
	return limit, nil
}

// PidsHeadroom returns how many more tasks process pid's cgroup can take
// now: the smallest pids.max − pids.current over its cgroup and every
// ancestor that sets a limit (other processes in those cgroups count too).
// -1 means no limit.
func PidsHeadroom(pid int) (int64, error) {
	levels, err := pidsLevels(pid)
	if err != nil {
		return 0, fmt.Errorf("pids headroom: %w", err)
	}
	room := int64(-1)
	for _, l := range levels {
		if l.max < 0 {
			continue
		}
		cur, err := readPidsCurrent(filepath.Join(l.dir, "pids.current"))
		if err != nil {
			return 0, fmt.Errorf("pids headroom: %w", err)
		}
		room = tighter(room, max(0, l.max-cur))
	}
	return room, nil
}

// pidsLevel is one cgroup whose pids limit applies, and its pids.max (-1:
// none).
type pidsLevel struct {
	dir string
	max int64
}

// pidsLevels reads pids.max of every cgroup level that applies to pid.
func pidsLevels(pid int) ([]pidsLevel, error) {
	dirs, err := pidsDirs(pid)
	if err != nil {
		return nil, err
	}
	levels := make([]pidsLevel, 0, len(dirs))
	for _, d := range dirs {
		m, err := readPidsMax(filepath.Join(d, "pids.max"))
		if err != nil {
			return nil, err
		}
		levels = append(levels, pidsLevel{dir: d, max: m})
	}
	return levels, nil
}

// pidsDirs lists the cgroup directories whose pids limits apply to process
// pid: its own cgroup and each ancestor, in the v2 hierarchy and in v1's
// pids hierarchy, whichever are mounted.
func pidsDirs(pid int) ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var root string
		switch {
		case parts[0] == "0" && parts[1] == "":
			root = Root // v2
			if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
				root = filepath.Join(Root, "unified") // v1/v2 hybrid
			}
		case hasController(parts[1], "pids"):
			root = filepath.Join(Root, "pids")
		default:
			continue
		}
		dirs = append(dirs, ancestors(root, parts[2])...)
	}
	return dirs, sc.Err()
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// ancestors lists cgroup rel under root and each of its parents up to root.
func ancestors(root, rel string) []string {
	var dirs []string
	for p := path.Clean("/" + rel); ; p = path.Dir(p) {
		dirs = append(dirs, filepath.Join(root, p))
		if p == "/" {
			return dirs
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

// readPidsCurrent reads one pids.current (0 when the file is missing).
func readPidsCurrent(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", file, b, err)
	}
	return n, nil
}
