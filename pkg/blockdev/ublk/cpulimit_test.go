package ublk

import (
	"os"
	"testing"
	"testing/fstest"
)

// TestCPULimit checks the cgroup CPU limit the server sizes its threads
// by, on cgroup v1 (this host's kind) and v2 (the VM's and most nodes')
// trees: a pod limited to 1.5 CPUs on a node of many gets two threads, not
// one per CPU of its affinity mask (before: the affinity count alone).
func TestCPULimit(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	v2 := fstest.MapFS{
		"proc/self/cgroup":                       file("0::/kubepods/pod1/c1\n"),
		"proc/self/mountinfo":                    file("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"),
		"sys/fs/cgroup/kubepods/pod1/c1/cpu.max": file("max 100000\n"),
		"sys/fs/cgroup/kubepods/pod1/cpu.max":    file("150000 100000\n"),
		"sys/fs/cgroup/kubepods/cpu.max":         file("3200000 100000\n"),
	}
	// A container with a cgroup namespace: it sees its own cgroup as /,
	// mounted at /sys/fs/cgroup.
	v2ns := fstest.MapFS{
		"proc/self/cgroup":      file("0::/\n"),
		"proc/self/mountinfo":   file("30 23 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"),
		"sys/fs/cgroup/cpu.max": file("50000 100000\n"),
	}
	v1 := fstest.MapFS{
		"proc/self/cgroup": file("4:memory:/x\n2:cpu,cpuacct:/kubepods/pod2\n0::/\n"),
		"proc/self/mountinfo": file("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" +
			"32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n" +
			"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"),
		"sys/fs/cgroup/cpu,cpuacct/kubepods/pod2/cpu.cfs_quota_us":  file("250000\n"),
		"sys/fs/cgroup/cpu,cpuacct/kubepods/pod2/cpu.cfs_period_us": file("100000\n"),
		"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":                file("-1\n"),
		"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us":               file("100000\n"),
	}
	none := fstest.MapFS{
		"proc/self/cgroup":                    file("1:cpu:/\n0::/\n"),
		"proc/self/mountinfo":                 file("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
		"sys/fs/cgroup/cpu/cpu.cfs_quota_us":  file("-1\n"),
		"sys/fs/cgroup/cpu/cpu.cfs_period_us": file("100000\n"),
	}
	for _, c := range []struct {
		name    string
		fsys    fstest.MapFS
		limit   float64
		threads int // on 128 CPUs
	}{
		{"v2", v2, 1.5, 2},
		{"v2 namespace", v2ns, 0.5, 1},
		{"v1", v1, 2.5, 3},
		{"v1 unlimited", none, 0, 128},
		{"unreadable", fstest.MapFS{}, 0, 128},
	} {
		limit := cpuLimit(c.fsys)
		if limit != c.limit {
			t.Errorf("%s: limit %v CPUs, want %v", c.name, limit, c.limit)
		}
		if n := cpuThreads(128, limit); n != c.threads {
			t.Errorf("%s: %d threads on 128 CPUs, want %d", c.name, n, c.threads)
		}
	}
	// This machine's own tree reads without error (v1 here, v2 in the VM).
	t.Logf("this process: CPU limit %v, %d usable CPUs", cpuLimit(os.DirFS("/")), usableCPUs())
}
