package ublk

import (
	"bufio"
	"bytes"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

// cpuLimit returns the CPU bandwidth limit of the process's cgroup, in
// CPUs (quota over period, the lowest along the cgroup and its ancestors
// within the mount), or 0 when none applies or it cannot be read. fsys is
// the root of the file system ("proc/self/cgroup", "proc/self/mountinfo"
// and the cgroup mounts under it). cgroup v2 (cpu.max) and v1 (the cpu
// controller's cpu.cfs_quota_us and cpu.cfs_period_us) are both read: a
// plugin pod's CPU limit is such a quota, while its affinity mask still
// names every CPU of the node.
func cpuLimit(fsys fs.FS) float64 {
	cgroups, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return 0
	}
	mounts, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return 0
	}
	limit := 0.0
	for _, m := range cgroupMounts(mounts) {
		p, ok := cgroupPath(cgroups, m.v2)
		if !ok {
			continue
		}
		rel, ok := strings.CutPrefix(p, m.root)
		if !ok {
			continue
		}
		// The limit nearest the root may be the lowest: walk up.
		for dir := path.Join(m.point, rel); ; dir = path.Dir(dir) {
			if l := dirLimit(fsys, dir, m.v2); l > 0 && (limit == 0 || l < limit) {
				limit = l
			}
			if dir == m.point || dir == "." || dir == "/" {
				break
			}
		}
	}
	return limit
}

// cpuThreads is how many server threads fit cpus CPUs under a limit of
// limit CPUs (0: none): the limit rounded up, at most cpus, at least one.
func cpuThreads(cpus int, limit float64) int {
	if limit > 0 {
		cpus = min(cpus, int(math.Ceil(limit)))
	}
	return max(cpus, 1)
}

// cgroupMount is where a cgroup hierarchy that carries CPU limits is
// mounted: the cgroup it shows (root) at point, relative to fsys.
type cgroupMount struct {
	root, point string
	v2          bool
}

// cgroupMounts returns the cgroup2 mounts and the cgroup v1 mounts of the
// cpu controller in mountinfo.
func cgroupMounts(mountinfo []byte) []cgroupMount {
	var out []cgroupMount
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		m := cgroupMount{root: f[3], point: strings.TrimPrefix(f[4], "/")}
		switch {
		case g[0] == "cgroup2":
			m.v2 = true
		case g[0] == "cgroup" && hasOption(g[2], "cpu"):
		default:
			continue
		}
		if m.point == "" {
			m.point = "."
		}
		out = append(out, m)
	}
	return out
}

func hasOption(opts, name string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

// cgroupPath returns the process's cgroup in the v2 hierarchy or in the v1
// hierarchy of the cpu controller, from /proc/self/cgroup.
func cgroupPath(cgroups []byte, v2 bool) (string, bool) {
	for line := range strings.SplitSeq(string(cgroups), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return parts[2], true
		}
		if !v2 && hasOption(parts[1], "cpu") {
			return parts[2], true
		}
	}
	return "", false
}

// dirLimit reads one cgroup directory's CPU limit in CPUs (0: none).
func dirLimit(fsys fs.FS, dir string, v2 bool) float64 {
	if v2 {
		b, err := fs.ReadFile(fsys, path.Join(dir, "cpu.max"))
		if err != nil {
			return 0
		}
		f := strings.Fields(string(b))
		if len(f) != 2 || f[0] == "max" {
			return 0
		}
		return ratio(f[0], f[1])
	}
	q, err1 := fs.ReadFile(fsys, path.Join(dir, "cpu.cfs_quota_us"))
	p, err2 := fs.ReadFile(fsys, path.Join(dir, "cpu.cfs_period_us"))
	if err1 != nil || err2 != nil {
		return 0
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

// ratio is quota/period, or 0 for an unlimited (negative) or bad quota.
func ratio(quota, period string) float64 {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0
	}
	return float64(q) / float64(p)
}
