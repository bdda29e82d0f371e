package blkdev

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Number returns the major and minor number of the block device at
// path (links are followed).
func Number(path string) (major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, 0, fmt.Errorf("%s is not a block device: %w", path, blockdev.ErrInvalid)
	}
	return unix.Major(st.Rdev), unix.Minor(st.Rdev), nil
}

// Size returns the size in bytes of the block device at path (a device
// node, a link to one, or a file a device is bind-mounted onto).
func Size(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var size uint64
	conn, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("device %s: %w", path, err)
	}
	var ioctlErr error
	err = conn.Control(func(fd uintptr) {
		size, ioctlErr = unix.IoctlGetUint64(int(fd), unix.BLKGETSIZE64)
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", path, err)
	}
	return int64(size), nil
}

// IsDevice reports whether path (after following links) is a block
// device node.
func IsDevice(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFBLK, nil
}

// SetReadOnly sets or clears the block device's read-only flag
// (BLKROSET). A read-only bind mount does not stop writes to a device node,
// since writing a device does not modify the filesystem holding the node;
// the device's own flag does.
func SetReadOnly(path string, ro bool) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	v := 0
	if ro {
		v = 1
	}
	if err := unix.IoctlSetPointerInt(fd, unix.BLKROSET, v); err != nil {
		return fmt.Errorf("BLKROSET %s: %w", path, err)
	}
	return nil
}
