package ublk

// A minimal, test-only ublk control client (ADD_DEV, SET_PARAMS, START_DEV,
// STOP_DEV, DEL_DEV), so the queue can be tested against the real kernel
// before the device code lands. To be deleted once device_linux.go exists.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// requireUblk skips unless the kernel has ublk and we are root.
func requireUblk(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for /dev/ublk-control")
	}
	if _, err := os.Stat("/dev/ublk-control"); err != nil {
		t.Skip("no /dev/ublk-control: this kernel has no ublk (run in the VM: hack/vm/run.sh)")
	}
}

type testCtl struct {
	fd   int
	ring *uring.Ring
}

func openTestCtl(t *testing.T) *testCtl {
	t.Helper()
	fd, err := unix.Open("/dev/ublk-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open ublk-control: %v", err)
	}
	ring, err := uring.New(uring.Config{Entries: 4, Flags: uring.IORING_SETUP_SQE128})
	if err != nil {
		unix.Close(fd)
		t.Fatalf("control ring: %v", err)
	}
	c := &testCtl{fd: fd, ring: ring}
	t.Cleanup(func() { ring.Close(); unix.Close(fd) })
	return c
}

// cmd runs one control command synchronously; buf (if any) is pinned.
func (c *testCtl) cmd(op uint32, devID uint32, buf unsafe.Pointer, n int, data uint64) (int32, error) {
	var pin runtime.Pinner
	defer pin.Unpin()
	if buf != nil {
		pin.Pin(buf)
	}
	s := c.ring.GetSQE128()
	if s == nil {
		return 0, errors.New("no sqe")
	}
	s.SQE.PrepURingCmd(int32(c.fd), op)
	a := s.Cmd()
	binary.LittleEndian.PutUint32(a[0:], devID)
	binary.LittleEndian.PutUint16(a[4:], 0xffff)
	binary.LittleEndian.PutUint16(a[6:], uint16(n))
	binary.LittleEndian.PutUint64(a[8:], uint64(uintptr(buf)))
	binary.LittleEndian.PutUint64(a[16:], data)
	if _, err := c.ring.SubmitAndWait(1, 30*time.Second); err != nil {
		return 0, err
	}
	cq := make([]uring.CQE, 1)
	if c.ring.Reap(cq) != 1 {
		return 0, errors.New("no cqe")
	}
	if cq[0].Res < 0 {
		return cq[0].Res, fmt.Errorf("ublk control %#x: %w", op, unix.Errno(-cq[0].Res))
	}
	return cq[0].Res, nil
}

func (c *testCtl) features() uint64 {
	var f uint64
	if _, err := c.cmd(cmdGetFeatures, 0, unsafe.Pointer(&f), 8, 0); err != nil {
		return 0
	}
	return f
}

// testDev is a ublk device made for a queue test.
type testDev struct {
	ctl     *testCtl
	info    DevInfo
	charFD  int
	started bool
}

func addTestDev(t *testing.T, c *testCtl, queues, depth uint16, maxIO uint32, flags uint64, sizeBytes int64) *testDev {
	t.Helper()
	d := &testDev{ctl: c, charFD: -1}
	d.info = DevInfo{NrHWQueues: queues, QueueDepth: depth, MaxIOBufBytes: maxIO,
		DevID: ^uint32(0), Flags: flags | FlagCmdIoctlEncode}
	if _, err := c.cmd(cmdAddDev, ^uint32(0), unsafe.Pointer(&d.info), int(unsafe.Sizeof(d.info)), 0); err != nil {
		t.Fatalf("add dev: %v", err)
	}
	t.Cleanup(d.remove)
	path := fmt.Sprintf("/dev/ublkc%d", d.info.DevID)
	deadline := time.Now().Add(5 * time.Second)
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			d.charFD = fd
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open %s: %v", path, err)
		}
		runtime.Gosched()
	}
	p := params{Types: paramTypeBasic | paramTypeDiscard}
	p.Len = uint32(unsafe.Sizeof(p))
	p.Basic = paramBasic{Attrs: attrVolatileCache | attrFUA, LogicalBSShift: 9, PhysicalBSShift: 12,
		IOOptShift: 12, IOMinShift: 9, MaxSectors: maxIO >> 9, DevSectors: uint64(sizeBytes >> 9)}
	p.Discard = paramDiscard{DiscardGranularity: 4096, MaxDiscardSectors: 1 << 20,
		MaxWriteZeroesSectors: 1 << 20, MaxDiscardSegments: 1}
	if _, err := c.cmd(cmdSetParams, d.info.DevID, unsafe.Pointer(&p), int(p.Len), 0); err != nil {
		t.Fatalf("set params: %v", err)
	}
	return d
}

func (d *testDev) start(t *testing.T) string {
	t.Helper()
	if _, err := d.ctl.cmd(cmdStartDev, d.info.DevID, nil, 0, uint64(os.Getpid())); err != nil {
		t.Fatalf("start dev: %v", err)
	}
	d.started = true
	return fmt.Sprintf("/dev/ublkb%d", d.info.DevID)
}

func (d *testDev) stop() error {
	if !d.started {
		return nil
	}
	d.started = false
	_, err := d.ctl.cmd(cmdStopDev, d.info.DevID, nil, 0, 0)
	return err
}

// remove stops the device (if started), closes ublkc and deletes it.
func (d *testDev) remove() {
	d.stop()
	if d.charFD >= 0 {
		unix.Close(d.charFD)
		d.charFD = -1
	}
	d.ctl.cmd(cmdDelDev, d.info.DevID, nil, 0, 0)
}
