package ublk

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// diskSlots is a server thread's share of the request slots (tags) of the
// disk that holds the backing file fd, when threads server threads send
// it their reads and writes (dataplane.QueueConfig.DiskSlots). A thread
// that sends more than the disk has slots has the kernel hand the excess
// to its io-wq workers, shared by every device it serves and served in
// arrival order, so it holds the excess itself instead (the data plane's
// admission). The share is half of what one hardware queue of the disk
// gives each thread that submits to it (threads on the same CPUs share a
// hardware queue), leaving the rest to the filesystem's own I/O and to
// other users of the disk. 0 means no bound: a file that is not on a
// request-based block device (tmpfs, a device-mapper or btrfs volume), or
// a disk whose figures cannot be read.
func diskSlots(fd, threads int) int {
	dir, err := diskDir(fd)
	if err != nil || threads <= 0 {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "queue", "nr_requests"))
	if err != nil {
		return 0
	}
	slots, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || slots <= 0 {
		return 0
	}
	hwq, err := os.ReadDir(filepath.Join(dir, "mq"))
	if err != nil || len(hwq) == 0 {
		return 0 // not blk-mq: no request slots to run out of
	}
	share := slots * min(len(hwq), threads) / threads / 2
	return max(share, minDiskSlots)
}

// minDiskSlots is the smallest share diskSlots gives a thread.
const minDiskSlots = 4

// diskDir is the sysfs directory of the whole disk that holds the file fd
// (for a file on a partition, the partition's disk).
func diskDir(fd int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("fstat backing file: %w", err)
	}
	if unix.Major(st.Dev) == 0 {
		return "", fmt.Errorf("backing file on device %d:%d: not a block device", unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	dir, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir)
	}
	return dir, nil
}
