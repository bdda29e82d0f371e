// This file holds the queue's only unsafe code: reading the descriptor
// array the kernel shares with us, and taking the address of mmapped I/O
// buffers for SQEs. It is sound because:
//
//   - the descriptor area, the buffers and the USER_COPY pool
//     (queue_pool_linux.go) are unix.Mmap'ed, outside the Go
//     heap; the GC never moves or frees them, and they stay mapped until
//     close, which the server thread calls only after its ring is gone;
//   - a descriptor is read only after its tag's FETCH/COMMIT completion was
//     seen through the CQ tail (an atomic load in the engine), which orders
//     it after the kernel's store (drivers/block/ublk_drv.c fills the
//     descriptor before completing the uring_cmd);
//   - every index is checked against depth.

package dataplane

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// descArea is one queue's read-only mapping of its ublksrv_io_desc array:
//
//	/dev/ublkcN offset  qid*stride                      (stride = round_up(4096*24, pagesize))
//	                    ┌────────┬────────┬─────┬──────────────┐
//	                    │ desc 0 │ desc 1 │ ... │ desc depth-1 │  24 bytes each
//	                    └────────┴────────┴─────┴──────────────┘
//	length              round_up(depth*24, pagesize)
//
// The stride uses the kernel's maximum depth, not the device's: the driver
// finds the queue as offset / stride (ublk_ch_mmap).
type descArea struct {
	mem   []byte
	depth int
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// descOffset is the mmap offset of queue qid's descriptors.
func descOffset(qid uint16, pageSize int) int64 {
	return int64(qid) * int64(roundUp(uapi.MaxQueueDepth*uapi.SizeofIODesc, pageSize))
}

// descLength is the mmap length of a queue's descriptors.
func descLength(depth uint16, pageSize int) int {
	return roundUp(int(depth)*uapi.SizeofIODesc, pageSize)
}

// mapDescs maps queue qid's descriptor array of /dev/ublkcN read-only.
func mapDescs(charFD int, qid, depth uint16) (*descArea, error) {
	ps := unix.Getpagesize()
	mem, err := unix.Mmap(charFD, descOffset(qid, ps), descLength(depth, ps),
		unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap descriptors of queue %d: %w", qid, err)
	}
	return &descArea{mem: mem, depth: int(depth)}, nil
}

// request decodes the descriptor of tag. tag < depth is the caller's
// invariant (tags come from our own user_data).
func (d *descArea) request(tag uint16) request {
	p := (*uapi.IODesc)(unsafe.Pointer(&d.mem[int(tag)*uapi.SizeofIODesc]))
	return decodeDesc(p.OpFlags, p.NrSectors, p.StartSector)
}

func (d *descArea) close() error {
	if d == nil || d.mem == nil {
		return nil
	}
	err := unix.Munmap(d.mem)
	d.mem = nil
	return err
}

// bufArea is the per-tag I/O buffers of a copy-mode queue: one anonymous
// mapping, page-aligned (as O_DIRECT needs), tag t at t*size. Pages are
// touched only when used (no huge pages), so an idle queue costs address
// space, not RSS; registering a head as a fixed buffer pins it
// (loop.registered, as requests need it).
type bufArea struct {
	mem  []byte
	size int
}

func mapBuffers(depth uint16, size uint32) (*bufArea, error) {
	sz := roundUp(int(size), unix.Getpagesize())
	mem, err := unix.Mmap(-1, 0, int(depth)*sz, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d i/o buffers of %d bytes: %w", depth, sz, err)
	}
	// Without this, transparent huge pages make the first 4 KiB request
	// on a tag fault in 2 MiB, and 4k random I/O makes all of a device's
	// buffers resident instead of the pages it touches
	// (docs/benchmark-studies.md, "Figures behind code comments").
	if err := unix.Madvise(mem, unix.MADV_NOHUGEPAGE); err != nil && !errors.Is(err, unix.EINVAL) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("madvise i/o buffers: %w", err)
	}
	return &bufArea{mem: mem, size: sz}, nil
}

// addr is the address of tag's buffer plus off, for an SQE or a FETCH.
func (b *bufArea) addr(tag uint16, off uint32) uint64 {
	return addrOf(b.mem[int(tag)*b.size:]) + uint64(off)
}

// addrOf is the address of b's first byte, for an SQE: b is part of a
// mapping made here (a buffer area or a USER_COPY pool), so it does not
// move.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// slice is tag's whole buffer (for registering it with the ring).
func (b *bufArea) slice(tag uint16) []byte {
	return b.mem[int(tag)*b.size : (int(tag)+1)*b.size]
}

func (b *bufArea) close() error {
	if b == nil || b.mem == nil {
		return nil
	}
	err := unix.Munmap(b.mem)
	b.mem = nil
	return err
}
