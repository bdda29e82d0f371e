package uring

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Buffers is one anonymous private mmap split into equal slots. The memory
// is page-aligned and outside the Go heap, so it suits O_DIRECT and may be
// handed to the kernel without pinning. Not safe for concurrent Close.
type Buffers struct {
	mem  []byte
	size int
	n    int
}

// NewBuffers maps n slots of size bytes each; size is rounded up to the
// page size so every slot is page-aligned.
func NewBuffers(n, size int) (*Buffers, error) {
	if n <= 0 || size <= 0 {
		return nil, fmt.Errorf("allocate buffers %d x %d: %w", n, size, unix.EINVAL)
	}
	page := unix.Getpagesize()
	size = (size + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, n*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("allocate buffers %d x %d: %w", n, size, err)
	}
	return &Buffers{mem: mem, size: size, n: n}, nil
}

// Len returns the number of slots.
func (b *Buffers) Len() int { return b.n }

// SlotSize returns the (page-rounded) size of each slot.
func (b *Buffers) SlotSize() int { return b.size }

// Slot returns slot i (full capacity-limited, so appends cannot spill).
// It panics if i is out of range or the Buffers are closed.
func (b *Buffers) Slot(i int) []byte {
	off := i * b.size
	return b.mem[off : off+b.size : off+b.size]
}

// Slots returns every slot, e.g. for Ring.RegisterBuffers.
func (b *Buffers) Slots() [][]byte {
	s := make([][]byte, b.n)
	for i := range s {
		s[i] = b.Slot(i)
	}
	return s
}

// Bytes returns the whole mapping.
func (b *Buffers) Bytes() []byte { return b.mem }

// Close unmaps the memory; it is idempotent. No slot may be used (or be
// registered with, or in flight on, a ring) afterwards.
func (b *Buffers) Close() error {
	if b.mem == nil {
		return nil
	}
	mem := b.mem
	b.mem = nil
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("unmap buffers: %w", err)
	}
	return nil
}
