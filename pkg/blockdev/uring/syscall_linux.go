// The three io_uring system calls, one raw entry each. They use
// unix.Syscall6 (never RawSyscall) so a blocking wait releases the P, and
// keep the memory they pass alive across the call with runtime.KeepAlive.
//
// Soundness of the unsafe.Pointer arguments: each pointer is converted to
// uintptr inside the unix.Syscall6 call expression, and the pointee is kept
// alive until the call returns.

package uring

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setup calls io_uring_setup(entries, p).
func setup(entries uint32, p *params) (int, error) {
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0, 0, 0, 0)
		runtime.KeepAlive(p)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
}

// enter calls io_uring_enter once. EINTR is returned to the caller, which
// knows whether and how to retry (a timed wait must keep its deadline).
func enter(fd int, toSubmit, minComplete, flags uint32, arg unsafe.Pointer, argSize uintptr) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit),
		uintptr(minComplete), uintptr(flags), uintptr(arg), argSize)
	runtime.KeepAlive(arg)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// register calls io_uring_register(fd, op, arg, nrArgs), retrying EINTR.
func register(fd int, op uint32, arg unsafe.Pointer, nrArgs uint32) (int, error) {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uintptr(op),
			uintptr(arg), uintptr(nrArgs), 0, 0)
		runtime.KeepAlive(arg)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}

func isEINTR(err error) bool { return err == unix.EINTR }
