// Kernel feature probes. Each probe does the smallest real operation
// (io_uring_setup with the flag, IORING_REGISTER_PROBE) and caches only
// conclusive answers: nil (supported) or ErrNotSupported.

package uring

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotSupported is wrapped by probes (and New) when the kernel lacks a
// feature.
var ErrNotSupported = errors.New("not supported")

// enotsupp is the kernel-internal ENOTSUPP (524), which leaks to user space
// from some paths.
const enotsupp = unix.Errno(524)

// unsupported reports whether err is an errno an older kernel uses for
// "unknown flag or opcode".
func unsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, enotsupp)
}

var probeCache sync.Map // string -> error (conclusive answers only)

func cached(name string, fn func() error) error {
	if v, ok := probeCache.Load(name); ok {
		if v == nil {
			return nil
		}
		return v.(error)
	}
	err := fn()
	if err == nil || errors.Is(err, ErrNotSupported) {
		probeCache.Store(name, err)
	}
	return err
}

// HaveSetupFlags reports whether io_uring_setup accepts flags (exactly, no
// fallback) on a 2-entry ring.
func HaveSetupFlags(flags uint32) error {
	return cached(fmt.Sprintf("setup %#x", flags), func() error {
		p := &params{Flags: flags}
		fd, err := setup(2, p)
		if err == nil {
			unix.Close(fd)
			return nil
		}
		if unsupported(err) {
			return fmt.Errorf("io_uring setup flags %#x: %w", flags, ErrNotSupported)
		}
		return fmt.Errorf("probe io_uring setup flags %#x: %w", flags, err)
	})
}

// HaveSQE128 reports IORING_SETUP_SQE128 (5.19, commit ebdeb7c01d02).
func HaveSQE128() error { return HaveSetupFlags(IORING_SETUP_SQE128) }

// HaveCoopTaskrun reports IORING_SETUP_COOP_TASKRUN (5.19, commit
// e1169f06d8c3).
func HaveCoopTaskrun() error { return HaveSetupFlags(IORING_SETUP_COOP_TASKRUN) }

// HaveSingleIssuer reports IORING_SETUP_SINGLE_ISSUER (6.0, commit
// 97bbdc06a444).
func HaveSingleIssuer() error { return HaveSetupFlags(IORING_SETUP_SINGLE_ISSUER) }

// HaveDeferTaskrun reports IORING_SETUP_DEFER_TASKRUN (6.1, commit
// c0e0d6ba25f1); it needs SINGLE_ISSUER.
func HaveDeferTaskrun() error {
	return HaveSetupFlags(IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN)
}

// HaveOp reports whether the kernel supports opcode op
// (IORING_REGISTER_PROBE, 5.6).
func HaveOp(op uint8) error {
	return cached(fmt.Sprintf("op %d", op), func() error {
		ops, err := probeOps()
		if err != nil {
			return err
		}
		if int(op) < len(ops) && ops[op].Flags&IO_URING_OP_SUPPORTED != 0 {
			return nil
		}
		return fmt.Errorf("io_uring opcode %d: %w", op, ErrNotSupported)
	})
}

// HaveURingCmd reports IORING_OP_URING_CMD (5.19).
func HaveURingCmd() error { return HaveOp(IORING_OP_URING_CMD) }

// probeOps runs IORING_REGISTER_PROBE on a throwaway ring.
func probeOps() ([]probeOp, error) {
	p := &params{}
	fd, err := setup(2, p)
	if err != nil {
		if unsupported(err) || errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("io_uring: %w", ErrNotSupported)
		}
		return nil, fmt.Errorf("probe io_uring ops: %w", err)
	}
	defer unix.Close(fd)
	pr := &probe{}
	if _, err := register(fd, IORING_REGISTER_PROBE, unsafe.Pointer(pr), uint32(len(pr.Ops))); err != nil {
		if unsupported(err) {
			return nil, fmt.Errorf("io_uring register probe: %w", ErrNotSupported)
		}
		return nil, fmt.Errorf("probe io_uring ops: %w", err)
	}
	return pr.Ops[:pr.OpsLen], nil
}
