package ublk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// touchMtime sets the mtime of the open file fd to the current time,
// leaving its atime alone; the kernel sets the ctime with it. It is
// futimens(fd, {UTIME_OMIT, UTIME_NOW}): utimensat with a NULL path acts on
// fd itself, which unix.UtimesNanoAt cannot express, and this form
// allocates nothing.
func touchMtime(fd int) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_NOW}}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
