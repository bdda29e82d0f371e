// Waker: an eventfd for cross-thread wake-ups of a ring owner.
//
// Soundness: Wake and Drain pass an 8-byte Go value to write/read, which
// complete synchronously (no asynchronous kernel access).

package uring

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waker wakes a ring owner from another goroutine: the owner keeps a
// POLL_ADD on the eventfd armed (PrepPoll); Wake makes it complete. Wake,
// FD and Close are safe for concurrent use.
type Waker struct {
	mu sync.RWMutex // guards fd against Close during Wake
	fd int
}

// NewWaker creates a non-blocking, close-on-exec eventfd.
func NewWaker() (*Waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("create eventfd: %w", err)
	}
	return &Waker{fd: fd}, nil
}

// FD returns the eventfd, or -1 after Close.
func (w *Waker) FD() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.fd
}

// Wake adds 1 to the eventfd counter. Safe from any goroutine.
func (w *Waker) Wake() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.fd < 0 {
		return fmt.Errorf("wake eventfd: %w", os.ErrClosed)
	}
	one := uint64(1)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&one)), 8)
	for {
		_, err := unix.Write(w.fd, b)
		switch err {
		case unix.EINTR:
			continue
		case nil, unix.EAGAIN: // counter saturated: a wake-up is pending anyway
			return nil
		default:
			return fmt.Errorf("wake eventfd: %w", err)
		}
	}
}

// PrepPoll prepares sqe as a one-shot POLL_ADD(POLLIN) on the eventfd with
// the given user_data. Re-arm it after each completion.
func (w *Waker) PrepPoll(sqe *SQE, userData uint64) {
	sqe.PrepPollAdd(int32(w.FD()), unix.POLLIN)
	sqe.UserData = userData
}

// Drain resets the counter and returns how many wake-ups it held (0 if
// none).
func (w *Waker) Drain() (uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.fd < 0 {
		return 0, fmt.Errorf("drain eventfd: %w", os.ErrClosed)
	}
	var v uint64
	b := unsafe.Slice((*byte)(unsafe.Pointer(&v)), 8)
	for {
		_, err := unix.Read(w.fd, b)
		switch err {
		case unix.EINTR:
			continue
		case nil:
			return v, nil
		case unix.EAGAIN:
			return 0, nil
		default:
			return 0, fmt.Errorf("drain eventfd: %w", err)
		}
	}
}

// Close closes the eventfd; it is idempotent.
func (w *Waker) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	fd := w.fd
	w.fd = -1
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close eventfd: %w", err)
	}
	return nil
}
