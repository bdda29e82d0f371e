package quiesce

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// FlushDevice writes the block device's cached writes (page cache of
// buffered writers) to it and then sends it a flush (fsync of a block
// device, block/fops.c blkdev_fsync): when it returns, every write the
// device completed before the call is in its backing file (the loop driver
// turns the flush into an fsync of the file, drivers/block/loop.c
// lo_req_flush). Writes keep flowing during and after the call; it does
// not hold the device.
func FlushDevice(ctx context.Context, path string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("flush %s: %w", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("flush %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("flush %s: %w", path, err)
	}
	return nil
}
