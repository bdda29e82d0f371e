// The three io_uring system calls, one raw entry each. Anything that may
// block uses unix.Syscall6, so a blocking wait releases the P, and
// keep the memory they pass alive across the call with runtime.KeepAlive.
//
// Soundness of the unsafe.Pointer arguments: each pointer is converted to
// uintptr inside the unix.(Raw)Syscall6 call expression, and the pointee is kept
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
//
// Only an enter that submits and neither waits nor asks for events
// (rawEnter) goes through RawSyscall6, which keeps the P and skips the
// scheduler's syscall bookkeeping, a measurable cost when each I/O is its
// own enter: io_uring issues it with IOCB_NOWAIT and hands what would block
// to its workers. Every other one uses Syscall6, so the P is released if
// it sleeps: a wait, and any enter with GETEVENTS, which on a DEFER_TASKRUN
// ring runs the ring's task work (completions that copy data to user
// memory, and so may fault and sleep).
func enter(fd int, toSubmit, minComplete, flags uint32, arg unsafe.Pointer, argSize uintptr) (int, error) {
	var n uintptr
	var errno unix.Errno
	if rawEnter(minComplete, flags) {
		n, _, errno = unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit),
			uintptr(minComplete), uintptr(flags), uintptr(arg), argSize)
	} else {
		n, _, errno = unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit),
			uintptr(minComplete), uintptr(flags), uintptr(arg), argSize)
	}
	runtime.KeepAlive(arg)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// rawEnter says whether an enter may keep its P (RawSyscall6): only when it
// waits for nothing and runs no task work (no GETEVENTS).
func rawEnter(minComplete, flags uint32) bool {
	return minComplete == 0 && flags&IORING_ENTER_GETEVENTS == 0
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
