package blockdev

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// FSStats is what a mounted filesystem reports through statfs.
type FSStats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

// StatFS reads the usage of the filesystem mounted at path.
func StatFS(path string) (FSStats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return FSStats{
		TotalBytes:     int64(st.Blocks) * bs,
		AvailableBytes: int64(st.Bavail) * bs,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bs,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
	}, nil
}

// AllocatedBytes returns the bytes of disk the file at path occupies
// (st_blocks of 512 bytes): less than its size while it is sparse, more
// when the filesystem allocated ahead.
func AllocatedBytes(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

// DeviceSize returns the size in bytes of the block device at path (a device
// node, a link to one, or a file a device is bind-mounted onto).
func DeviceSize(path string) (int64, error) {
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

// IsBlockDevice reports whether path (after following links) is a block
// device node.
func IsBlockDevice(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFBLK, nil
}

// SetDeviceReadOnly sets or clears the block device's read-only flag
// (BLKROSET). A read-only bind mount does not stop writes to a device node,
// since writing a device does not modify the filesystem holding the node;
// the device's own flag does.
func SetDeviceReadOnly(path string, ro bool) error {
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
