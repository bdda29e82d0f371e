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

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
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

// Control is a connection to /dev/ublk-control. It is safe for concurrent
// use, and commands run concurrently: each takes a channel of its own (an
// SQE128 io_uring and a payload page, ctrlChan) from an idle list, or
// makes one, so that one command that waits its whole timeout (a STOP_DEV
// or DEL_DEV of a device still held) delays no other device's attach or
// detach. mu guards the fd and the idle list only, never a command.
type Control struct {
	mu     sync.Mutex
	fd     int // /dev/ublk-control, -1 once closed and unused
	closed bool
	busy   int         // channels out with a command
	idle   []*ctrlChan // channels ready for the next command
}

// ctrlChan is one command at a time's ring and payload page.
type ctrlChan struct {
	fd   int
	ring *uring.Ring
	page *payload
	cqes [1]uring.CQE
	dead bool // abandoned: never used again
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

// Close releases the control fd and the idle channels; channels still out
// with a command are released when it returns. It is idempotent.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, ch := range c.idle {
		errs = append(errs, ch.release())
	}
	c.idle = nil
	if c.busy == 0 {
		errs = append(errs, unix.Close(c.fd))
		c.fd = -1
	}
	return errors.Join(errs...)
}

// get returns a channel for one command: an idle one, or a new one.
func (c *Control) get() (*ctrlChan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("ublk control: %w", os.ErrClosed)
	}
	if n := len(c.idle); n > 0 {
		ch := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.busy++
		return ch, nil
	}
	r, err := uring.New(uring.Config{Entries: 4, Flags: uring.IORING_SETUP_SQE128})
	if err != nil {
		return nil, fmt.Errorf("create control ring: %w", err)
	}
	p, err := newPayload()
	if err != nil {
		r.Close()
		return nil, err
	}
	c.busy++
	return &ctrlChan{fd: c.fd, ring: r, page: p}, nil
}

// put gives back the channel of a finished command. An abandoned one is
// dropped; after Close every one is released, and the last closes the fd.
func (c *Control) put(ch *ctrlChan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	switch {
	case ch.dead:
	case c.closed:
		_ = ch.release()
	default:
		c.idle = append(c.idle, ch)
	}
	if c.closed && c.busy == 0 && c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

func (ch *ctrlChan) release() error {
	return errors.Join(ch.ring.Close(), ch.page.release())
}

// abandon drops a channel whose command did not answer in time or failed
// to reach the kernel. Closing the ring cancels the command; the payload
// page is leaked on purpose (one page), since the kernel may still write
// to it.
func (ch *ctrlChan) abandon() {
	_ = ch.ring.Close()
	ch.dead = true
}

// submit issues one control command and waits for its result, at most
// timeout (cmdTimeout when not positive: no command waits unbounded). The
// header fields are the caller's; name is used in errors.
func (ch *ctrlChan) submit(name string, op uint32, h uapi.CtrlCmd, timeout time.Duration) (int32, error) {
	if timeout <= 0 {
		timeout = cmdTimeout
	}
	sqe := ch.ring.GetSQE128()
	if sqe == nil {
		return 0, fmt.Errorf("ublk %s: control ring full", name)
	}
	sqe.SQE.PrepURingCmd(int32(ch.fd), op)
	sqe.SQE.UserData = uint64(op)
	putCtrlCmd(sqe.Cmd()[:], h)
	if _, err := ch.ring.SubmitAndWait(1, timeout); err != nil {
		ch.abandon() // the command may be queued or running
		return 0, fmt.Errorf("ublk %s dev %d: %w", name, h.DevID, err)
	}
	if n := ch.ring.Reap(ch.cqes[:]); n != 1 || ch.cqes[0].UserData != uint64(op) {
		ch.abandon()
		return 0, fmt.Errorf("ublk %s dev %d: no completion", name, h.DevID)
	}
	res := ch.cqes[0].Res
	if res < 0 {
		return res, fmt.Errorf("ublk %s dev %d: %w", name, h.DevID, unix.Errno(-res))
	}
	return res, nil
}

// putCtrlCmd writes struct ublksrv_ctrl_cmd little-endian at the start of
// the SQE128 command area (SQE offset 48).
func putCtrlCmd(b []byte, h uapi.CtrlCmd) {
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
	ch, err := c.get()
	if err != nil {
		return err
	}
	defer c.put(ch)
	_, err = ch.submit(name, op, uapi.CtrlCmd{DevID: devID, QueueID: noQueue, Data: data}, timeout)
	return err
}

// GetFeatures returns the UBLK_F_* flags the driver supports (6.5+).
func (c *Control) GetFeatures() (uint64, error) {
	ch, err := c.get()
	if err != nil {
		return 0, err
	}
	defer c.put(ch)
	ch.page.clear(uapi.FeaturesLen)
	h := uapi.CtrlCmd{DevID: ^uint32(0), QueueID: noQueue, Len: uapi.FeaturesLen, Addr: ch.page.addr()}
	if _, err := ch.submit("get features", uapi.CmdGetFeatures, h, cmdTimeout); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(ch.page.bytes(uapi.FeaturesLen)), nil
}

// AddDev creates a device from info (DevID ^0 allocates one) and returns
// the negotiated info: the id and the flags the kernel accepted.
func (c *Control) AddDev(info DevInfo) (DevInfo, error) {
	ch, err := c.get()
	if err != nil {
		return DevInfo{}, err
	}
	defer c.put(ch)
	n := ch.page.putDevInfo(info)
	h := uapi.CtrlCmd{DevID: info.DevID, QueueID: noQueue, Len: n, Addr: ch.page.addr()}
	if _, err := ch.submit("add dev", uapi.CmdAddDev, h, cmdTimeout); err != nil {
		return DevInfo{}, err
	}
	return ch.page.devInfo(), nil
}

// GetDevInfo returns the device's info. An unknown id fails with ENODEV.
func (c *Control) GetDevInfo(devID uint32) (DevInfo, error) {
	ch, err := c.get()
	if err != nil {
		return DevInfo{}, err
	}
	defer c.put(ch)
	n := ch.page.putDevInfo(DevInfo{})
	h := uapi.CtrlCmd{DevID: devID, QueueID: noQueue, Len: n, Addr: ch.page.addr()}
	if _, err := ch.submit("get dev info", uapi.CmdGetDevInfo, h, cmdTimeout); err != nil {
		return DevInfo{}, err
	}
	return ch.page.devInfo(), nil
}

// setParams sends SET_PARAMS (only before START_DEV).
func (c *Control) setParams(devID uint32, p uapi.Params) error {
	ch, err := c.get()
	if err != nil {
		return err
	}
	defer c.put(ch)
	n := ch.page.putParams(p)
	h := uapi.CtrlCmd{DevID: devID, QueueID: noQueue, Len: n, Addr: ch.page.addr()}
	_, err = ch.submit("set params", uapi.CmdSetParams, h, cmdTimeout)
	return err
}

// getParams sends GET_PARAMS: the parameters the kernel keeps for the
// device (set by SET_PARAMS, size updated by UPDATE_SIZE). The kernel reads
// the header's len first, so the page carries it in.
func (c *Control) getParams(devID uint32) (uapi.Params, error) {
	ch, err := c.get()
	if err != nil {
		return uapi.Params{}, err
	}
	defer c.put(ch)
	n := ch.page.putParams(uapi.Params{Len: uapi.SizeofParams})
	h := uapi.CtrlCmd{DevID: devID, QueueID: noQueue, Len: n, Addr: ch.page.addr()}
	if _, err := ch.submit("get params", uapi.CmdGetParams, h, cmdTimeout); err != nil {
		return uapi.Params{}, err
	}
	return ch.page.params(), nil
}

// QueueAffinity returns the CPUs the kernel maps to queue qid.
func (c *Control) QueueAffinity(devID uint32, qid uint16) ([]int, error) {
	ch, err := c.get()
	if err != nil {
		return nil, err
	}
	defer c.put(ch)
	const maskLen = 512 // 4096 CPUs, a multiple of sizeof(long)
	ch.page.clear(maskLen)
	h := uapi.CtrlCmd{DevID: devID, QueueID: noQueue, Len: maskLen, Addr: ch.page.addr(), Data: uint64(qid)}
	if _, err := ch.submit("get queue affinity", uapi.CmdGetQueueAffinity, h, cmdTimeout); err != nil {
		return nil, err
	}
	return cpusOf(ch.page.bytes(maskLen)), nil
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
	return c.simple("start dev", uapi.CmdStartDev, devID, uint64(pid), startDevTimeout)
}

// StopDev removes the block device and aborts parked IO commands.
func (c *Control) StopDev(devID uint32) error {
	return c.simple("stop dev", uapi.CmdStopDev, devID, 0, cmdTimeout)
}

// DelDev removes the device. async uses DEL_DEV_ASYNC (6.9+), which does
// not wait for the last reference; the synchronous form is bounded by the
// command timeout so a held /dev/ublkbN cannot hang the caller.
func (c *Control) DelDev(devID uint32, async bool) error {
	if async {
		return c.simple("del dev async", uapi.CmdDelDevAsync, devID, 0, cmdTimeout)
	}
	return c.simple("del dev", uapi.CmdDelDev, devID, 0, cmdTimeout)
}

// StartUserRecovery begins re-adopting a QUIESCED or FAIL_IO device. It
// fails with EBUSY while the old server's /dev/ublkcN is still open.
func (c *Control) StartUserRecovery(devID uint32) error {
	return c.simple("start user recovery", uapi.CmdStartUserRecovery, devID, 0, cmdTimeout)
}

// EndUserRecovery finishes recovery once the new queues have FETCHed.
func (c *Control) EndUserRecovery(devID uint32, pid int) error {
	return c.simple("end user recovery", uapi.CmdEndUserRecovery, devID, uint64(pid), startDevTimeout)
}

// UpdateSize changes a live device's size (UBLK_F_UPDATE_SIZE, 6.16+).
func (c *Control) UpdateSize(devID uint32, sizeBytes int64) error {
	return c.simple("update size", uapi.CmdUpdateSize, devID, uint64(sizeBytes)>>9, cmdTimeout)
}

// QuiesceDev quiesces a live device for a planned restart (UBLK_F_QUIESCE).
func (c *Control) QuiesceDev(devID uint32, timeout time.Duration) error {
	return c.simple("quiesce dev", uapi.CmdQuiesceDev, devID, uint64(timeout.Milliseconds()), timeout+cmdTimeout)
}
