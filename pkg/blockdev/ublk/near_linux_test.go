package ublk

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestControlQueueAffinity reads every queue's CPUs from the kernel
// (UBLK_U_CMD_GET_QUEUE_AFFINITY) for a device of one queue per CPU, as
// blk-mq maps them before START_DEV: each queue has CPUs, no CPU is in two
// queues, every CPU we may use is in one, and a queue the device does not
// have is refused.
func TestControlQueueAffinity(t *testing.T) {
	needUblk(t)
	cpus := dataplane.AllowedCPUs()
	c := openTestCtl(t)
	d := addTestDev(t, c, uint16(len(cpus)), 16, 64<<10, 0, 64<<20)
	var all []int
	for q := range len(cpus) {
		got, err := c.QueueAffinity(d.info.DevID, uint16(q))
		if err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
		t.Logf("queue %d: CPUs %v", q, got)
		if len(got) == 0 {
			t.Fatalf("queue %d: no CPUs", q)
		}
		for _, cpu := range got {
			if slices.Contains(all, cpu) {
				t.Fatalf("queue %d: CPU %d already mapped to another queue (%v)", q, cpu, all)
			}
		}
		all = append(all, got...)
	}
	for _, cpu := range cpus {
		if !slices.Contains(all, cpu) {
			t.Errorf("CPU %d in no queue's set %v", cpu, all)
		}
	}
	if got, err := c.QueueAffinity(d.info.DevID, uint16(len(cpus))); !errors.Is(err, unix.EINVAL) {
		t.Errorf("queue %d of %d: %v, %v; want EINVAL", len(cpus), len(cpus), got, err)
	}
}

// TestServerNearQueues checks that with ThreadConfig.Near each queue of a
// device is served by the thread pinned to a CPU the kernel maps to the
// queue, where the spread (least loaded thread first) would not: devices
// of two queues, one before and one after a device of one queue, get
// their queue 0 on thread 0 and then on thread 1 when spread, so one of
// them is off its CPUs whichever CPU blk-mq maps to queue 0.
func TestServerNearQueues(t *testing.T) {
	needUblk(t)
	if len(dataplane.AllowedCPUs()) < 2 {
		t.Skip("needs 2 CPUs")
	}
	dir := scratchDir(t)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: filepath.Join(dir, "state"),
		Thread: ThreadConfig{Near: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range errs {
		t.Errorf("start-up: %v", e)
	}
	ctx := context.Background()
	for i, queues := range []int{2, 1, 2} {
		id := []string{"two", "one", "three"}[i]
		sv, err := s.Attach(ctx, AttachSpec{VolumeID: id, Null: true, SizeBytes: 64 << 20, Queues: queues, Depth: 16})
		if err != nil {
			t.Fatal(err)
		}
		dev := s.get(id).dev
		for q, queue := range dev.queues {
			near, err := s.ctl.QueueAffinity(dev.ID(), uint16(q))
			if err != nil {
				t.Fatal(err)
			}
			cpu := queue.Thread().CPU()
			t.Logf("%s (%s) queue %d: thread %d on CPU %d, kernel's CPUs %v", id, sv.Path, q, queue.Thread().ID(), cpu, near)
			if !slices.Contains(near, cpu) {
				t.Errorf("%s queue %d on CPU %d, not one of the kernel's %v", id, q, cpu, near)
			}
		}
	}
}
