package main

// The reference column of the scale benchmark: the same files served by
// another ublk server, one daemon per device, given to the benchmark as a
// binary (--ref-ublk). The project does not build or ship it.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// refFirstID is the first ublk device number the reference server's
// devices take: far above the plugin's, which a run before may have left.
const refFirstID = 900

// refComm is the command name of the reference server's per-device daemon
// (its "loop" target), whose CPU the run reports.
const refComm = "ublk.loop"

// scaleRef measures the reference ublk server: one device per file of the
// same size, with as many queues and as deep as the plugin's devices get
// on this machine, served with direct I/O (its default).
func scaleRef(ctx context.Context, c scaleConfig) error {
	if c.refUblk == "" {
		return fmt.Errorf("bench scale: --mode ref needs --ref-ublk")
	}
	var ids []int
	defer func() {
		for _, id := range ids {
			if out, err := exec.Command(c.refUblk, "del", "-n", strconv.Itoa(id)).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "bench scale: ref del %d: %v: %s\n", id, err, out)
			}
		}
	}()
	var devs []string
	for i := range c.volumes {
		file, err := c.backingFile(fmt.Sprintf("ref-%d.img", i))
		if err != nil {
			return err
		}
		defer os.Remove(file)
		id := refFirstID + i
		out, err := exec.CommandContext(ctx, c.refUblk, "add", "-t", "loop", "-n", strconv.Itoa(id),
			"-q", strconv.Itoa(c.refQueues), "-d", strconv.Itoa(c.refDepth), "-f", file).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ref add %s: %w: %s", file, err, out)
		}
		ids = append(ids, id)
		dev := fmt.Sprintf("/dev/ublkb%d", id)
		if err := waitForDevice(ctx, dev, 10*time.Second); err != nil {
			return err
		}
		devs = append(devs, dev)
	}
	if err := c.fill(ctx, devs); err != nil {
		return err
	}
	before, err := commSample(refComm)
	if err != nil {
		return err
	}
	ios, guest, err := c.runFioGuestCPU(ctx, devs)
	if err != nil {
		return err
	}
	after, err := commSample(refComm)
	if err != nil {
		return err
	}
	line := c.describe(ios) + guest
	line += fmt.Sprintf(" threads=%d rss_mib=%.1f", after.threads, float64(after.rssKiB)/1024)
	if ios.total > 0 {
		line += fmt.Sprintf(" cpu_us_per_io=%.2f", float64(after.cpuTicks-before.cpuTicks)*1e6/clockTicks/float64(ios.total))
		if d := after.ctxsw - before.ctxsw; d >= 0 {
			line += fmt.Sprintf(" ctxsw_per_io=%.3f", float64(d)/float64(ios.total))
		}
	}
	fmt.Println(line)
	return nil
}

// waitForDevice waits until the block device node dev exists.
func waitForDevice(ctx context.Context, dev string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(dev); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", dev, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// commSample sums procFigures over every process whose command name is
// comm.
func commSample(comm string) (procFigures, error) {
	var sum procFigures
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return sum, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		f, err := procSample(pid)
		if err != nil {
			continue // it ended in between
		}
		sum.threads += f.threads
		sum.rssKiB += f.rssKiB
		sum.cpuTicks += f.cpuTicks
		sum.ctxsw += f.ctxsw
	}
	return sum, nil
}
