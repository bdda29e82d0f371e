package loop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Control is the loop control device.
const Control = "/dev/loop-control"

// loopMajor is the block major of loop devices (include/uapi/linux/major.h).
const loopMajor = 7

// Options says how to attach a file.
type Options struct {
	ReadOnly bool
	// DirectIO asks the loop device to bypass the page cache of the
	// backing file (LO_FLAGS_DIRECT_IO). Device.DirectIO says whether the
	// kernel kept it on.
	DirectIO bool
	// BlockSize is the logical block size (512..4096, a power of two;
	// 0 = 512). 4096 lets O_DIRECT work on backing files on 4 KiB disks.
	BlockSize uint32
	// Mark is stored as the device's lo_file_name (at most MaxMark
	// bytes; "" stores the file's path, as losetup does). The kernel
	// keeps it, and returns it (Device.Mark), unchanged for the
	// device's life, so it proves who bound a device when the backing
	// path cannot: another user, or another mount namespace on the same
	// kernel, can bind the same path.
	Mark string
}

// MaxMark is the longest Options.Mark: lo_file_name holds LO_NAME_SIZE (64)
// bytes with a terminating NUL.
const MaxMark = len(unix.LoopInfo64{}.File_name) - 1

// Device describes one bound loop device.
type Device struct {
	Number int
	// Path is /dev/loopN.
	Path string
	// BackingFile is the absolute path of the attached file as the kernel
	// reports it (a " (deleted)" suffix is stripped; Deleted is set).
	BackingFile string
	Deleted     bool
	// Mark is the device's lo_file_name (see Options.Mark).
	Mark string
	// BackingDev and BackingInode identify the backing file (st_dev and
	// st_ino as stat reports them), whatever path reaches it.
	BackingDev, BackingInode uint64
	SizeBytes                int64
	BlockSize                int
	DirectIO                 bool
	ReadOnly                 bool
}

// attachRetries bounds how often Attach retries when another process binds
// the free device it was given before it could.
const attachRetries = 32

// Attach binds file to a free loop device. The returned device stays bound
// after the process exits, until Detach.
func Attach(file string, opts Options) (Device, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", file, err)
	}
	if len(opts.Mark) > MaxMark {
		return Device{}, fmt.Errorf("attach %s: mark %q longer than %d bytes: %w", file, opts.Mark, MaxMark, os.ErrInvalid)
	}
	if opts.Mark == "" {
		opts.Mark = abs
	}
	flags := unix.O_RDWR
	if opts.ReadOnly {
		flags = unix.O_RDONLY
	}
	backing, err := unix.Open(abs, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", abs, err)
	}
	defer unix.Close(backing)
	ctl, err := unix.Open(Control, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", abs, err)
	}
	defer unix.Close(ctl)
	for range attachRetries {
		n, added, err := newDevice(ctl)
		if err != nil {
			return Device{}, fmt.Errorf("attach %s: %w", abs, err)
		}
		err = bind(n, backing, opts)
		if errors.Is(err, unix.EBUSY) {
			continue // another attacher won this device; ask again
		}
		if err != nil {
			if added {
				remove(ctl, n)
			}
			return Device{}, fmt.Errorf("attach %s: %w", abs, err)
		}
		return Get(n)
	}
	return Device{}, fmt.Errorf("attach %s: %w (every free device was taken)", abs, unix.EBUSY)
}

// newDevice returns the number of an unbound loop device for Attach, and
// whether it was made for this call. It asks the driver for a new device
// (LOOP_CTL_ADD with no number takes the first unused one) rather than a
// free existing one: the kernel keeps a device's I/O counters
// (/sys/block/loopN/stat) across detach and re-attach, so a reused device
// would report earlier users' I/O as this file's. Where the driver refuses
// to add one (a max_loop limit), any free device will do.
func newDevice(ctl int) (n int, added bool, err error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(ctl), unix.LOOP_CTL_ADD, ^uintptr(0))
	if errno == 0 {
		return int(r), true, nil
	}
	n, err = unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return 0, false, fmt.Errorf("get free loop device (add: %v): %w", errno, err)
	}
	return n, false, nil
}

// remove deletes the unbound device n (LOOP_CTL_REMOVE), so that the next
// Attach makes a new one with zeroed counters and unused devices do not
// pile up. It is best effort: the kernel refuses (EBUSY) while anyone has
// the device open or bound, and then it stays as it is.
func remove(ctl, n int) {
	_ = unix.IoctlSetInt(ctl, unix.LOOP_CTL_REMOVE, n)
}

// bind configures device n with the backing fd.
func bind(n, backing int, opts Options) error {
	path, err := ensureNode(n)
	if err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	cfg := unix.LoopConfig{Fd: uint32(backing), Size: opts.BlockSize}
	cfg.Info.Flags = statusFlags(opts)
	copy(cfg.Info.File_name[:MaxMark], opts.Mark)
	err = unix.IoctlLoopConfigure(fd, &cfg)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
		// Before Linux 5.8 LOOP_CONFIGURE is unknown (EINVAL from the
		// loop ioctl switch); configure step by step.
		return bindLegacy(fd, path, backing, cfg.Info, opts)
	}
	if err != nil {
		return fmt.Errorf("configure %s: %w", path, err)
	}
	return nil
}

func statusFlags(opts Options) uint32 {
	var f uint32
	if opts.DirectIO {
		f |= unix.LO_FLAGS_DIRECT_IO
	}
	if opts.ReadOnly {
		f |= unix.LO_FLAGS_READ_ONLY
	}
	return f
}

// bindLegacy is LOOP_CONFIGURE's older equivalent. Direct I/O is best
// effort: a kernel that refuses it leaves the device buffered.
func bindLegacy(fd int, path string, backing int, info unix.LoopInfo64, opts Options) error {
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, backing); err != nil {
		return fmt.Errorf("set fd %s: %w", path, err)
	}
	info.Flags &^= unix.LO_FLAGS_DIRECT_IO | unix.LO_FLAGS_READ_ONLY
	err := unix.IoctlLoopSetStatus64(fd, &info)
	if err == nil && opts.BlockSize != 0 {
		err = unix.IoctlSetInt(fd, unix.LOOP_SET_BLOCK_SIZE, int(opts.BlockSize))
	}
	if err != nil {
		unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("set status %s: %w", path, err)
	}
	if opts.DirectIO {
		unix.IoctlSetInt(fd, unix.LOOP_SET_DIRECT_IO, 1)
	}
	return nil
}

// ensureNode returns /dev/loopN, making the node when /dev is not devtmpfs
// (a container with its own /dev).
func ensureNode(n int) (string, error) {
	path := fmt.Sprintf("/dev/loop%d", n)
	err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(loopMajor, uint32(n))))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("make node %s: %w", path, err)
	}
	return path, nil
}

// Detach unbinds the loop device at path. An unbound device returns nil; a
// device that is mounted or opened exclusively returns an error wrapping
// unix.EBUSY, and nothing changes. Detach waits (up to timeout) until the
// kernel has released the backing file, then removes the device (see
// remove).
func Detach(path string, timeout time.Duration) error {
	n, err := number(path)
	if err != nil {
		return err
	}
	// O_EXCL fails with EBUSY while a filesystem has the device mounted,
	// rather than LOOP_CLR_FD deferring the detach to the last close.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: %w", path, err)
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd) // the kernel finishes the teardown on this last close
	if errors.Is(err, unix.ENXIO) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: %w", path, err)
	}
	if err := waitUnbound(n, timeout); err != nil {
		return err
	}
	if ctl, err := unix.Open(Control, unix.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
		remove(ctl, n)
		unix.Close(ctl)
	}
	return nil
}

// waitUnbound polls sysfs until device n has no backing file.
func waitUnbound(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if _, err := os.Stat(sysPath(n, "loop/backing_file")); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("detach /dev/loop%d: still bound after %v: %w", n, timeout, unix.EBUSY)
		}
		time.Sleep(delay)
	}
}

// SetMark replaces the mark (lo_file_name) of the bound device at path,
// keeping its other settings (LOOP_GET_STATUS64, then LOOP_SET_STATUS64).
func SetMark(path, mark string) error {
	if len(mark) > MaxMark {
		return fmt.Errorf("mark %s: %q longer than %d bytes: %w", path, mark, MaxMark, os.ErrInvalid)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mark %s: %w", path, err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return fmt.Errorf("mark %s: %w", path, err)
	}
	info.File_name = [len(info.File_name)]byte{}
	copy(info.File_name[:MaxMark], mark)
	if err := unix.IoctlLoopSetStatus64(fd, info); err != nil {
		return fmt.Errorf("mark %s: %w", path, err)
	}
	return nil
}

// SetCapacity makes the device at path take the backing file's current size
// (LOOP_SET_CAPACITY) and returns the size the device now reports.
func SetCapacity(path string) (int64, error) {
	n, err := number(path)
	if err != nil {
		return 0, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("set capacity %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
		return 0, fmt.Errorf("set capacity %s: %w", path, err)
	}
	d, err := Get(n)
	return d.SizeBytes, err
}
