package main

// The figures the scale benchmark reads from /proc beside fio's: a
// process's threads, memory, CPU and context switches, and the whole
// machine's busy CPU time.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// guestBusyTicks is the CPU time every CPU of the machine spent busy (not
// idle nor waiting for I/O), in clockTicks, from /proc/stat: what a design
// costs the whole node (its server, the kernel's work for it, fio), where
// the plugin's own CPU leaves out the kernel's workers and loop has no
// process at all.
func guestBusyTicks() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// idle and iowait are not busy; guest time is already in user.
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return busy, nil
}

// guestCPU is the SCALE or LAT line's guest_cpu_us_per_io field: the
// machine's busy CPU time per I/O of the run.
func guestCPU(ticks int64, ios uint64) string {
	if ios == 0 {
		return ""
	}
	return fmt.Sprintf(" guest_cpu_us_per_io=%.2f", float64(ticks)*1e6/clockTicks/float64(ios))
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux architecture csi-fastblk runs on).
const clockTicks = 100

// procFigures are a process's threads, resident memory, CPU time and
// context switches (all its threads).
type procFigures struct {
	threads  int
	rssKiB   int64
	cpuTicks int64
	ctxsw    int64
}

// procSample reads procFigures of pid from /proc; pid 0 reads nothing.
func procSample(pid int) (procFigures, error) {
	var f procFigures
	if pid == 0 {
		return f, nil
	}
	base := fmt.Sprintf("/proc/%d", pid)
	status, err := os.ReadFile(base + "/status")
	if err != nil {
		return f, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fields[0], 10, 64)
		switch k {
		case "Threads":
			f.threads = int(n)
		case "VmRSS":
			f.rssKiB = n
		}
	}
	stat, err := os.ReadFile(base + "/stat")
	if err != nil {
		return f, err
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th of them.
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(rest) > 12 {
		u, _ := strconv.ParseInt(rest[11], 10, 64)
		s, _ := strconv.ParseInt(rest[12], 10, 64)
		f.cpuTicks = u + s
	}
	tasks, _ := filepath.Glob(base + "/task/*/status")
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				f.ctxsw += n
			}
		}
	}
	return f, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
