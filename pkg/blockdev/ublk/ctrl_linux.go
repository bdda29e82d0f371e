package ublk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// ControlPath is the ublk control device.
const ControlPath = "/dev/ublk-control"

// Timeouts of control commands. A command that does not answer in time is
// abandoned (its ring closed, which cancels it) and returns an error
// matching unix.ETIME: a control path must never hang the caller.
const (
	cmdTimeout      = 10 * time.Second
	startDevTimeout = 30 * time.Second
)

// Control is a connection to /dev/ublk-control: the device fd and an SQE128
// io_uring on which control commands are issued. It is safe for concurrent
// use; commands are serialised (lock order: Control.mu only).
type Control struct {
	mu   sync.Mutex
	fd   int // /dev/ublk-control, -1 when closed
	ring *uring.Ring
	page *payload
	cqes [1]uring.CQE
}

// OpenControl opens /dev/ublk-control.
func OpenControl() (*Control, error) {
	fd, err := unix.Open(ControlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("open %s: %w (is ublk_drv loaded?)", ControlPath, errors.ErrUnsupported)
		}
		return nil, fmt.Errorf("open %s: %w", ControlPath, err)
	}
	return &Control{fd: fd}, nil
}

// Close releases the control fd and ring. It is idempotent.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	var errs []error
	if c.ring != nil {
		errs = append(errs, c.ring.Close())
		c.ring = nil
	}
	if c.page != nil {
		errs = append(errs, c.page.release())
		c.page = nil
	}
	errs = append(errs, unix.Close(c.fd))
	c.fd = -1
	return errors.Join(errs...)
}

// prepare makes sure the ring and payload page exist. Called with mu held.
func (c *Control) prepare() error {
	if c.fd < 0 {
		return fmt.Errorf("ublk control: %w", os.ErrClosed)
	}
	if c.ring == nil {
		r, err := uring.New(uring.Config{Entries: 4, Flags: uring.IORING_SETUP_SQE128})
		if err != nil {
			return fmt.Errorf("create control ring: %w", err)
		}
		c.ring = r
	}
	if c.page == nil {
		p, err := newPayload()
		if err != nil {
			return err
		}
		c.page = p
	}
	return nil
}

// abandon drops a ring whose command did not answer in time or failed to
// reach the kernel. Closing the ring cancels the command; the payload page
// is leaked on purpose (one page), since the kernel may still write to it.
// Called with mu held.
func (c *Control) abandon() {
	if c.ring != nil {
		_ = c.ring.Close()
		c.ring = nil
	}
	c.page = nil
}

// submit issues one control command and waits for its result, at most
// timeout (cmdTimeout when not positive: no command waits unbounded). The
// header fields are the caller's; name is used in errors. Called with mu
// held.
func (c *Control) submit(name string, op uint32, h ctrlCmd, timeout time.Duration) (int32, error) {
	if timeout <= 0 {
		timeout = cmdTimeout
	}
	sqe := c.ring.GetSQE128()
	if sqe == nil {
		return 0, fmt.Errorf("ublk %s: control ring full", name)
	}
	sqe.SQE.PrepURingCmd(int32(c.fd), op)
	sqe.SQE.UserData = uint64(op)
	putCtrlCmd(sqe.Cmd()[:], h)
	if _, err := c.ring.SubmitAndWait(1, timeout); err != nil {
		c.abandon() // the command may be queued or running: start afresh
		return 0, fmt.Errorf("ublk %s dev %d: %w", name, h.DevID, err)
	}
	if n := c.ring.Reap(c.cqes[:]); n != 1 || c.cqes[0].UserData != uint64(op) {
		c.abandon()
		return 0, fmt.Errorf("ublk %s dev %d: no completion", name, h.DevID)
	}
	res := c.cqes[0].Res
	if res < 0 {
		return res, fmt.Errorf("ublk %s dev %d: %w", name, h.DevID, unix.Errno(-res))
	}
	return res, nil
}

// putCtrlCmd writes struct ublksrv_ctrl_cmd little-endian at the start of
// the SQE128 command area (SQE offset 48).
func putCtrlCmd(b []byte, h ctrlCmd) {
	le := binary.LittleEndian
	clear(b[:32])
	le.PutUint32(b[0:], h.DevID)
	le.PutUint16(b[4:], h.QueueID)
	le.PutUint16(b[6:], h.Len)
	le.PutUint64(b[8:], h.Addr)
	le.PutUint64(b[16:], h.Data)
	le.PutUint16(b[24:], h.DevPathLen)
}

// noQueue is ctrl_cmd.queue_id for commands not aimed at a queue.
const noQueue = 0xffff

// simple issues a command that carries at most one inline datum.
func (c *Control) simple(name string, op uint32, devID uint32, data uint64, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return err
	}
	_, err := c.submit(name, op, ctrlCmd{DevID: devID, QueueID: noQueue, Data: data}, timeout)
	return err
}

// GetFeatures returns the UBLK_F_* flags the driver supports (6.5+).
func (c *Control) GetFeatures() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return 0, err
	}
	c.page.clear(featuresLen)
	h := ctrlCmd{DevID: ^uint32(0), QueueID: noQueue, Len: featuresLen, Addr: c.page.addr()}
	if _, err := c.submit("get features", cmdGetFeatures, h, cmdTimeout); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(c.page.bytes(featuresLen)), nil
}

// AddDev creates a device from info (DevID ^0 allocates one) and returns
// the negotiated info: the id and the flags the kernel accepted.
func (c *Control) AddDev(info DevInfo) (DevInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return DevInfo{}, err
	}
	n := c.page.putDevInfo(info)
	h := ctrlCmd{DevID: info.DevID, QueueID: noQueue, Len: n, Addr: c.page.addr()}
	if _, err := c.submit("add dev", cmdAddDev, h, cmdTimeout); err != nil {
		return DevInfo{}, err
	}
	return c.page.devInfo(), nil
}

// GetDevInfo returns the device's info. An unknown id fails with ENODEV.
func (c *Control) GetDevInfo(devID uint32) (DevInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return DevInfo{}, err
	}
	n := c.page.putDevInfo(DevInfo{})
	h := ctrlCmd{DevID: devID, QueueID: noQueue, Len: n, Addr: c.page.addr()}
	if _, err := c.submit("get dev info", cmdGetDevInfo, h, cmdTimeout); err != nil {
		return DevInfo{}, err
	}
	return c.page.devInfo(), nil
}

// setParams sends SET_PARAMS (only before START_DEV).
func (c *Control) setParams(devID uint32, p params) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return err
	}
	n := c.page.putParams(p)
	h := ctrlCmd{DevID: devID, QueueID: noQueue, Len: n, Addr: c.page.addr()}
	_, err := c.submit("set params", cmdSetParams, h, cmdTimeout)
	return err
}

// QueueAffinity returns the CPUs the kernel maps to queue qid.
func (c *Control) QueueAffinity(devID uint32, qid uint16) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.prepare(); err != nil {
		return nil, err
	}
	const maskLen = 512 // 4096 CPUs, a multiple of sizeof(long)
	c.page.clear(maskLen)
	h := ctrlCmd{DevID: devID, QueueID: noQueue, Len: maskLen, Addr: c.page.addr(), Data: uint64(qid)}
	if _, err := c.submit("get queue affinity", cmdGetQueueAffinity, h, cmdTimeout); err != nil {
		return nil, err
	}
	return cpusOf(c.page.bytes(maskLen)), nil
}

// cpusOf decodes a little-endian CPU bitmap.
func cpusOf(mask []byte) []int {
	var cpus []int
	for i, b := range mask {
		for bit := 0; bit < 8; bit++ {
			if b&(1<<bit) != 0 {
				cpus = append(cpus, i*8+bit)
			}
		}
	}
	return cpus
}

// StartDev makes the block device live; all queues must have FETCHed.
func (c *Control) StartDev(devID uint32, pid int) error {
	return c.simple("start dev", cmdStartDev, devID, uint64(pid), startDevTimeout)
}

// StopDev removes the block device and aborts parked IO commands.
func (c *Control) StopDev(devID uint32) error {
	return c.simple("stop dev", cmdStopDev, devID, 0, cmdTimeout)
}

// DelDev removes the device. async uses DEL_DEV_ASYNC (6.9+), which does
// not wait for the last reference; the synchronous form is bounded by the
// command timeout so a held /dev/ublkbN cannot hang the caller.
func (c *Control) DelDev(devID uint32, async bool) error {
	if async {
		return c.simple("del dev async", cmdDelDevAsync, devID, 0, cmdTimeout)
	}
	return c.simple("del dev", cmdDelDev, devID, 0, cmdTimeout)
}

// StartUserRecovery begins re-adopting a QUIESCED or FAIL_IO device. It
// fails with EBUSY while the old server's /dev/ublkcN is still open.
func (c *Control) StartUserRecovery(devID uint32) error {
	return c.simple("start user recovery", cmdStartUserRecovery, devID, 0, cmdTimeout)
}

// EndUserRecovery finishes recovery once the new queues have FETCHed.
func (c *Control) EndUserRecovery(devID uint32, pid int) error {
	return c.simple("end user recovery", cmdEndUserRecovery, devID, uint64(pid), startDevTimeout)
}

// UpdateSize changes a live device's size (UBLK_F_UPDATE_SIZE, 6.16+).
func (c *Control) UpdateSize(devID uint32, sizeBytes int64) error {
	return c.simple("update size", cmdUpdateSize, devID, uint64(sizeBytes)>>9, cmdTimeout)
}

// QuiesceDev quiesces a live device for a planned restart (UBLK_F_QUIESCE).
func (c *Control) QuiesceDev(devID uint32, timeout time.Duration) error {
	return c.simple("quiesce dev", cmdQuiesceDev, devID, uint64(timeout.Milliseconds()), timeout+cmdTimeout)
}
