package blockdev

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int)
// from include/uapi/linux/fs.h; x/sys/unix does not name them. The kernel
// ignores the argument (fs/ioctl.c, do_vfs_ioctl).
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// FreezeFS freezes the filesystem mounted at mountPath (FIFREEZE on its root
// directory): dirty data is written to the device and new writes block until
// thaw is called. thaw is safe to call more than once; only the first call
// thaws. The driver uses FreezeFS as the Quiesce of a mounted volume.
//
// A filesystem that is already frozen returns an error wrapping ErrBusy; one
// that cannot be frozen (no freeze support) wraps ErrNotSupported.
func FreezeFS(ctx context.Context, mountPath string) (thaw func() error, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	fd, err := unix.Open(mountPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	if _, err := unix.IoctlRetInt(fd, fiFreeze); err != nil {
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.EBUSY):
			err = fmt.Errorf("%w: %w", ErrBusy, err)
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
			err = fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	var once sync.Once
	var terr error
	return func() error {
		once.Do(func() {
			defer unix.Close(fd)
			if _, err := unix.IoctlRetInt(fd, fiThaw); err != nil {
				terr = fmt.Errorf("thaw %s: %w", mountPath, err)
			}
		})
		return terr
	}, nil
}
