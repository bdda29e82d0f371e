// Provided-buffer rings.
//
// Soundness: the ring and its buffers are anonymous mmaps outside the Go
// heap, shared with the kernel from registration until Close unregisters
// them. The application owns the ring's entries and its tail; the kernel
// reads an entry only after loading the tail (smp_load_acquire in
// io_uring/kbuf.c), so the entry is written first and the tail published
// with an atomic store. The tail overlays entry 0's resv (bytes 14-15), and
// Go has no 16-bit atomics, so every access to bytes 12-15 (entry 0's bid
// and the tail) is one 32-bit atomic.

package uring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BufRing is a ring of provided buffers (IORING_REGISTER_PBUF_RING, 5.19).
// An operation sent with IOSQE_BUFFER_SELECT and the ring's group (in
// SQE.BufIndex) has the kernel pick a buffer from it and name the buffer in
// its CQE (IORING_CQE_F_BUFFER, id from BufferID); the owner hands each
// buffer back with Recycle once it has read it. Like the Ring, it belongs
// to the ring's owner thread.
type BufRing struct {
	r     *Ring
	ring  []byte // entries × io_uring_buf; the tail overlays entry 0
	bufs  []byte // entries × size
	size  int
	mask  uint16
	tail  uint16
	group uint16
}

// RegisterBufRing registers a ring of entries buffers of size bytes each as
// buffer group group, and provides every buffer. entries is a power of two
// up to 32768.
func (r *Ring) RegisterBufRing(group uint16, entries, size int) (*BufRing, error) {
	if r.closed {
		return nil, ErrClosed
	}
	if entries <= 0 || entries > 1<<15 || entries&(entries-1) != 0 || size <= 0 {
		return nil, fmt.Errorf("register buffer ring %d: %d buffers of %d bytes: %w", group, entries, size, unix.EINVAL)
	}
	ringBytes := entries * int(unsafe.Sizeof(bufDesc{}))
	mem, err := unix.Mmap(-1, 0, ringBytes+entries*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("register buffer ring %d: map: %w", group, err)
	}
	b := &BufRing{r: r, ring: mem[:ringBytes:ringBytes], bufs: mem[ringBytes:], size: size,
		mask: uint16(entries - 1), group: group}
	reg := bufReg{RingAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), RingEntries: uint32(entries), Bgid: group}
	if _, err := register(r.fd, IORING_REGISTER_PBUF_RING, unsafe.Pointer(&reg), 1); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("register buffer ring %d: %w", group, err)
	}
	for id := range entries {
		b.Recycle(uint16(id))
	}
	return b, nil
}

// Group returns the buffer group id to put in SQE.BufIndex.
func (b *BufRing) Group() uint16 { return b.group }

// Buf returns buffer id (capacity-limited).
func (b *BufRing) Buf(id uint16) []byte {
	off := int(id) * b.size
	return b.bufs[off : off+b.size : off+b.size]
}

// BufferID returns the id of the buffer a CQE used and whether it used one.
func BufferID(c *CQE) (uint16, bool) {
	return uint16(c.Flags >> IORING_CQE_BUFFER_SHIFT), c.Flags&IORING_CQE_F_BUFFER != 0
}

// Recycle provides buffer id to the kernel again (at the ring's tail).
func (b *BufRing) Recycle(id uint16) {
	slot := b.tail & b.mask
	d := (*bufDesc)(unsafe.Pointer(&b.ring[int(slot)*int(unsafe.Sizeof(bufDesc{}))]))
	d.Addr = uint64(uintptr(unsafe.Pointer(&b.bufs[int(id)*b.size])))
	d.Len = uint32(b.size)
	word := b.word()
	if slot == 0 {
		// Entry 0's bid shares the atomic word with the tail.
		atomic.StoreUint32(word, uint32(id)|uint32(b.tail)<<16)
	} else {
		d.Bid = id
	}
	b.tail++
	atomic.StoreUint32(word, atomic.LoadUint32(word)&0xffff|uint32(b.tail)<<16)
}

// word is bytes 12-15 of the ring: entry 0's bid and the tail.
func (b *BufRing) word() *uint32 { return (*uint32)(unsafe.Pointer(&b.ring[12])) }

// Close unregisters the group and unmaps its memory; it is idempotent. No
// operation selecting from the group may be in flight.
func (b *BufRing) Close() error {
	if b.ring == nil {
		return nil
	}
	var err error
	if !b.r.closed {
		reg := bufReg{Bgid: b.group}
		if _, e := register(b.r.fd, IORING_UNREGISTER_PBUF_RING, unsafe.Pointer(&reg), 1); e != nil {
			err = fmt.Errorf("unregister buffer ring %d: %w", b.group, e)
		}
	}
	mem := unsafe.Slice(&b.ring[0], len(b.ring)+len(b.bufs))
	b.ring, b.bufs = nil, nil
	if e := unix.Munmap(mem); e != nil && err == nil {
		err = fmt.Errorf("unmap buffer ring %d: %w", b.group, e)
	}
	return err
}
