// Registered files, buffers and ring fd.
//
// Soundness: the argument arrays live on the Go heap only for the duration
// of the io_uring_register call, which copies them (io_uring/rsrc.c@v6.1);
// the buffers they describe must stay mapped while registered.

package uring

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RegisterFiles registers fds as the fixed-file table (index i = fds[i]);
// use index i as SQE.Fd with IOSQE_FIXED_FILE.
func (r *Ring) RegisterFiles(fds []int32) error {
	if r.closed {
		return ErrClosed
	}
	if len(fds) == 0 {
		return fmt.Errorf("register files: empty table: %w", unix.EINVAL)
	}
	if _, err := register(r.fd, IORING_REGISTER_FILES, unsafe.Pointer(&fds[0]), uint32(len(fds))); err != nil {
		return fmt.Errorf("register files: %w", err)
	}
	return nil
}

// UnregisterFiles drops the fixed-file table.
func (r *Ring) UnregisterFiles() error {
	if r.closed {
		return ErrClosed
	}
	if _, err := register(r.fd, IORING_UNREGISTER_FILES, nil, 0); err != nil {
		return fmt.Errorf("unregister files: %w", err)
	}
	return nil
}

// RegisterBuffers registers bufs as fixed buffers (index i = bufs[i]) for
// READ_FIXED/WRITE_FIXED. The memory must stay mapped until unregistered.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	if r.closed {
		return ErrClosed
	}
	if len(bufs) == 0 {
		return fmt.Errorf("register buffers: empty table: %w", unix.EINVAL)
	}
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		if len(b) == 0 {
			return fmt.Errorf("register buffers: buffer %d is empty: %w", i, unix.EINVAL)
		}
		iov[i].Base = &b[0]
		iov[i].SetLen(len(b))
	}
	if _, err := register(r.fd, IORING_REGISTER_BUFFERS, unsafe.Pointer(&iov[0]), uint32(len(iov))); err != nil {
		return fmt.Errorf("register buffers: %w", err)
	}
	return nil
}

// RegisterBuffersSparse registers an empty buffer table of n slots, for the
// kernel (ublk AUTO_BUF_REG, REGISTER_IO_BUF) to fill.
func (r *Ring) RegisterBuffersSparse(n uint32) error {
	if r.closed {
		return ErrClosed
	}
	reg := rsrcRegister{Nr: n, Flags: IORING_RSRC_REGISTER_SPARSE}
	if _, err := register(r.fd, IORING_REGISTER_BUFFERS2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg))); err != nil {
		return fmt.Errorf("register sparse buffers: %w", err)
	}
	return nil
}

// UnregisterBuffers drops the buffer table.
func (r *Ring) UnregisterBuffers() error {
	if r.closed {
		return ErrClosed
	}
	if _, err := register(r.fd, IORING_UNREGISTER_BUFFERS, nil, 0); err != nil {
		return fmt.Errorf("unregister buffers: %w", err)
	}
	return nil
}

// RegisterRingFD registers the ring fd with the calling thread's io_uring
// context; later enters pass the index with IORING_ENTER_REGISTERED_RING,
// saving an fd lookup per call. Call it on the owner thread only.
func (r *Ring) RegisterRingFD() error {
	if r.closed {
		return ErrClosed
	}
	if r.regFD {
		return nil
	}
	upd := rsrcUpdate{Offset: ^uint32(0), Data: uint64(r.fd)} // any free slot
	if _, err := register(r.fd, IORING_REGISTER_RING_FDS, unsafe.Pointer(&upd), 1); err != nil {
		return fmt.Errorf("register ring fd: %w", err)
	}
	r.regFD = true
	r.enterFD = int(upd.Offset)
	r.enterFlags = IORING_ENTER_REGISTERED_RING
	return nil
}

// UnregisterRingFD undoes RegisterRingFD, so that the ring can be entered
// and closed from another thread: call it on the owner thread, before the
// thread exits or hands the ring on. Later enters use the fd.
func (r *Ring) UnregisterRingFD() error {
	if r.closed || !r.regFD {
		return nil
	}
	upd := rsrcUpdate{Offset: uint32(r.enterFD)}
	if _, err := register(r.fd, IORING_UNREGISTER_RING_FDS, unsafe.Pointer(&upd), 1); err != nil {
		return fmt.Errorf("unregister ring fd: %w", err)
	}
	r.regFD, r.enterFD, r.enterFlags = false, r.fd, 0
	return nil
}

// SetMaxWorkers caps io-wq workers (bounded, unbounded); 0 leaves a value
// unchanged. It returns the previous values.
func (r *Ring) SetMaxWorkers(bounded, unbounded uint32) ([2]uint32, error) {
	if r.closed {
		return [2]uint32{}, ErrClosed
	}
	v := [2]uint32{bounded, unbounded}
	if _, err := register(r.fd, IORING_REGISTER_IOWQ_MAX_WORKERS, unsafe.Pointer(&v), 2); err != nil {
		return [2]uint32{}, fmt.Errorf("set io-wq max workers: %w", err)
	}
	return v, nil
}

// RegisterFilesSparse registers an empty fixed-file table of n slots, to
// fill and clear later with UpdateFiles: a ring that serves a changing set
// of files (ublk devices coming and going) keeps one table for its life.
func (r *Ring) RegisterFilesSparse(n uint32) error {
	if r.closed {
		return ErrClosed
	}
	reg := rsrcRegister{Nr: n, Flags: IORING_RSRC_REGISTER_SPARSE}
	if _, err := register(r.fd, IORING_REGISTER_FILES2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg))); err != nil {
		return fmt.Errorf("register sparse files: %w", err)
	}
	return nil
}

// UpdateFiles replaces the fixed files from slot off on: slot off+i gets
// fds[i], or is cleared where fds[i] is -1. The ring keeps its own
// reference to each file, so the caller may close its fds afterwards;
// operations already issued on a replaced slot keep the old file.
func (r *Ring) UpdateFiles(off uint32, fds []int32) error {
	if r.closed {
		return ErrClosed
	}
	if len(fds) == 0 {
		return nil
	}
	upd := rsrcUpdate2{Offset: off, Data: uint64(uintptr(unsafe.Pointer(&fds[0]))), Nr: uint32(len(fds))}
	n, err := register(r.fd, IORING_REGISTER_FILES_UPDATE2, unsafe.Pointer(&upd), uint32(unsafe.Sizeof(upd)))
	runtime.KeepAlive(fds)
	if err != nil {
		return fmt.Errorf("update files %d..%d: %w", off, int(off)+len(fds)-1, err)
	}
	if n != len(fds) {
		return fmt.Errorf("update files %d..%d: kernel took %d: %w", off, int(off)+len(fds)-1, n, unix.EIO)
	}
	return nil
}

// UpdateBuffers replaces the fixed buffers from slot off on: slot off+i
// gets bufs[i], or is cleared where bufs[i] is empty. The table must have
// been registered (RegisterBuffers or RegisterBuffersSparse) with room for
// them. Registering pins the buffers' pages until the slot is cleared or
// the ring closed.
func (r *Ring) UpdateBuffers(off uint32, bufs [][]byte) error {
	if r.closed {
		return ErrClosed
	}
	if len(bufs) == 0 {
		return nil
	}
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		if len(b) > 0 {
			iov[i].Base = &b[0]
			iov[i].SetLen(len(b))
		}
	}
	upd := rsrcUpdate2{Offset: off, Data: uint64(uintptr(unsafe.Pointer(&iov[0]))), Nr: uint32(len(iov))}
	n, err := register(r.fd, IORING_REGISTER_BUFFERS_UPDATE, unsafe.Pointer(&upd), uint32(unsafe.Sizeof(upd)))
	runtime.KeepAlive(iov)
	if err != nil {
		return fmt.Errorf("update buffers %d..%d: %w", off, int(off)+len(bufs)-1, err)
	}
	if n != len(bufs) {
		return fmt.Errorf("update buffers %d..%d: kernel took %d: %w", off, int(off)+len(bufs)-1, n, unix.EIO)
	}
	return nil
}
