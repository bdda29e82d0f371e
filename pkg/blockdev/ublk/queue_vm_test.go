package ublk

// Helpers for the queue tests against the real kernel. They drive the
// control side with Control (ctrl_linux.go) but start the queues themselves,
// so a test chooses flags, buffers and targets per queue.

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// requireUblk skips unless the kernel has ublk and we are root.
func requireUblk(t *testing.T) {
	t.Helper()
	testgate.RequireUblk(t)
}

func openTestCtl(t *testing.T) *Control {
	t.Helper()
	c, err := OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func features(t *testing.T, c *Control) uint64 {
	f, err := c.GetFeatures()
	if err != nil {
		t.Fatalf("get features: %v", err)
	}
	return f
}

// testDev is a ublk device made for a queue test.
type testDev struct {
	ctl     *Control
	info    DevInfo
	charFD  int
	started bool
}

// addTestDev adds a device of sizeBytes (4 KiB blocks, VOLATILE_CACHE|FUA,
// discard) and opens its char device; t.Cleanup removes it.
func addTestDev(t *testing.T, c *Control, queues, depth uint16, maxIO uint32, flags uint64, sizeBytes int64) *testDev {
	t.Helper()
	info, err := c.AddDev(DevInfo{NrHWQueues: queues, QueueDepth: depth, MaxIOBufBytes: maxIO,
		DevID: ^uint32(0), Flags: flags | FlagCmdIoctlEncode})
	if err != nil {
		t.Fatalf("add dev: %v", err)
	}
	d := &testDev{ctl: c, info: info, charFD: -1}
	t.Cleanup(d.remove)
	path := charPath(info.DevID)
	err = poll(context.Background(), 5*time.Second, func() (bool, error) {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, nil // the node appears asynchronously
		}
		d.charFD = fd
		return true, nil
	})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	if err := c.setParams(info.DevID, deviceParams(DeviceConfig{SizeBytes: sizeBytes}, info)); err != nil {
		t.Fatalf("set params: %v", err)
	}
	return d
}

func (d *testDev) start(t *testing.T) string {
	t.Helper()
	if err := d.ctl.StartDev(d.info.DevID, os.Getpid()); err != nil {
		t.Fatalf("start dev: %v", err)
	}
	d.started = true
	return blockPath(d.info.DevID)
}

func (d *testDev) stop() error {
	if !d.started {
		return nil
	}
	d.started = false
	return d.ctl.StopDev(d.info.DevID)
}

// remove stops the device (if started), closes ublkc and deletes it.
func (d *testDev) remove() {
	d.stop()
	if d.charFD >= 0 {
		unix.Close(d.charFD)
		d.charFD = -1
	}
	d.ctl.DelDev(d.info.DevID, false)
}
