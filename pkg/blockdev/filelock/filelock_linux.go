// Package filelock holds a file's exclusive flock for the life of the
// process: the plugin locks its CSI socket's path with it, so that a second
// plugin on one node stops instead of taking the socket. (The data
// directory's own lock, shared by Stores of one process, is the store's.)
package filelock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Lock takes an exclusive lock on path (created if missing) for as long as
// the process lives or until release; a lock another open file holds fails
// with blockdev.ErrBusy.
func Lock(path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: held by another process: %w", path, blockdev.ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
