// Ring setup and teardown: io_uring_setup, the three mmaps, and pointers
// into them.
//
// Soundness: every unsafe.Pointer here points into memory mmapped from the
// ring fd, which stays mapped until Close; the GC neither scans nor moves
// it. Offsets come from io_uring_params filled in by the kernel.
//
// Memory layout (IORING_FEAT_SINGLE_MMAP, since 5.4: SQ and CQ rings share
// one mapping at IORING_OFF_SQ_RING; io_uring/io_uring.c rings_size@v6.1):
//
//	IORING_OFF_SQ_RING (ringMem)                  IORING_OFF_SQES (sqeMem)
//	+---------------------------------------+     +------------------------+
//	| sq.head sq.tail ... sq_flags dropped  |     | SQE 0 (64 or 128 bytes)|
//	| cq.head cq.tail ... overflow          |     | SQE 1                  |
//	| CQE[0] CQE[1] ... CQE[cq_entries-1]   |     | ...                    |
//	| sq_array[0 .. sq_entries-1] (u32)     |     | SQE sq_entries-1       |
//	+---------------------------------------+     +------------------------+
//
// The application owns sq.tail and cq.head; the kernel owns sq.head and
// cq.tail. Ordering: the kernel reads sq.tail with smp_load_acquire and
// publishes cq.tail with smp_store_release (io_uring/io_uring.c@v6.1,
// io_get_sqe/io_commit_cqring); sync/atomic loads and stores are
// sequentially consistent, which is at least as strong.

package uring

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits of io_uring_setup (IORING_MAX_ENTRIES, IORING_MAX_CQ_ENTRIES in
// io_uring/io_uring.c@v6.1).
const (
	maxEntries   = 32768
	maxCQEntries = 2 * maxEntries
)

// QueueFlags are the setup flags for a per-queue data ring: one issuer,
// task work deferred to the owner's waits, no IPIs for task work, and a
// flag in sq_flags telling a polling owner to enter the kernel.
const QueueFlags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
	IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG

// ErrClosed is returned by every Ring method after Close.
var ErrClosed = fmt.Errorf("io_uring ring: %w", os.ErrClosed)

// Config describes a ring to create.
type Config struct {
	// Entries is the SQ size, 1..32768 (the kernel rounds up to a power
	// of two).
	Entries uint32
	// CQEntries is the CQ size; 0 means 2 × Entries.
	CQEntries uint32
	// Flags are IORING_SETUP_* flags. SINGLE_ISSUER, DEFER_TASKRUN,
	// COOP_TASKRUN and TASKRUN_FLAG are dropped if the kernel refuses
	// them; CQSIZE is implied. SQPOLL, IOPOLL and CQE32 are refused.
	Flags uint32
	// PendingEntries bounds the engine's queue of SQEs waiting for ring
	// room; 0 means 4 × CQ entries.
	PendingEntries int
	// Unbounded lifts the bound on operations in flight (at most CQ
	// entries): the kernel keeps the CQEs that do not fit on its
	// overflow list. Benchmarks only, to measure what the bound is
	// worth; never set it otherwise.
	Unbounded bool
}

// Ring is one io_uring instance. It is not safe for concurrent use: it is
// owned by the goroutine (on its locked OS thread) that created it.
type Ring struct {
	fd         int
	enterFD    int    // fd, or the registered ring index
	enterFlags uint32 // IORING_ENTER_REGISTERED_RING when registered
	flags      uint32 // setup flags that took
	features   uint32
	sqeShift   uint // 6 for 64-byte SQEs, 7 for SQE128
	closed     bool

	ringMem, cqMem, sqeMem []byte

	sqHead, sqTail, sqFlags *uint32
	sqMask, sqEntries       uint32
	sqes                    unsafe.Pointer
	sqLocal                 uint32 // next SQ slot to hand out (our tail)

	cqHead, cqTail, cqOverflow *uint32
	cqMask, cqEntries          uint32
	cqBound                    uint32 // in-flight limit: cqEntries, unless Config.Unbounded
	cqes                       unsafe.Pointer

	inflight uint32 // consumed by the kernel, CQE not yet reaped

	pending     []SQE128 // FIFO of SQEs waiting for room
	pHead, pLen int

	arg    geteventsArg // EXT_ARG for timed waits; arg.Ts points at ts
	ts     kernelTimespec
	enters uint64
	// cleanup closes the fd and unmaps if a Ring is dropped unclosed
	// (a safety net; Close is the mechanism).
	cleanup runtime.Cleanup
	intrs   uint64 // EINTR retries, for tests and diagnostics
	regFD   bool
}

// New creates a ring. Call it on the OS thread that will use the ring
// (runtime.LockOSThread first) when Flags has SINGLE_ISSUER.
func New(cfg Config) (*Ring, error) {
	if cfg.Entries == 0 || cfg.Entries > maxEntries {
		return nil, fmt.Errorf("create io_uring: entries %d out of 1..%d: %w", cfg.Entries, maxEntries, unix.EINVAL)
	}
	if cfg.Flags&(IORING_SETUP_SQPOLL|IORING_SETUP_IOPOLL|IORING_SETUP_CQE32) != 0 {
		return nil, fmt.Errorf("create io_uring: flags %#x not supported by this engine: %w", cfg.Flags, unix.EINVAL)
	}
	cq := cfg.CQEntries
	if cq == 0 {
		cq = 2 * cfg.Entries
	}
	if cq < cfg.Entries || cq > maxCQEntries {
		return nil, fmt.Errorf("create io_uring: cq entries %d out of %d..%d: %w", cq, cfg.Entries, maxCQEntries, unix.EINVAL)
	}
	fd, p, err := setupWithFallback(cfg.Entries, cq, cfg.Flags|IORING_SETUP_CQSIZE)
	if err != nil {
		return nil, fmt.Errorf("create io_uring: %w", err)
	}
	r := &Ring{fd: fd, enterFD: fd, flags: p.Flags, features: p.Features}
	if err := r.mapRings(p); err != nil {
		r.unmap()
		unix.Close(fd)
		return nil, fmt.Errorf("create io_uring: %w", err)
	}
	r.cqBound = r.cqEntries
	if cfg.Unbounded {
		r.cqBound = math.MaxUint32 / 2
	}
	pend := cfg.PendingEntries
	if pend <= 0 {
		pend = 4 * int(r.cqEntries)
	}
	r.pending = make([]SQE128, pend)
	mem := [][]byte{r.sqeMem, r.cqMem, r.ringMem}
	r.cleanup = runtime.AddCleanup(r, func(fd int) {
		for _, m := range mem {
			if m != nil {
				_ = unix.Munmap(m)
			}
		}
		_ = unix.Close(fd)
	}, fd)
	r.arg.SigmaskSz = 8 // _NSIG/8; ignored while Sigmask is 0
	r.arg.Ts = uint64(uintptr(unsafe.Pointer(&r.ts)))
	return r, nil
}

// setupWithFallback calls io_uring_setup, dropping optional flags in a fixed
// order while the kernel answers EINVAL.
func setupWithFallback(entries, cq, flags uint32) (int, *params, error) {
	drops := []uint32{
		IORING_SETUP_DEFER_TASKRUN,
		IORING_SETUP_SINGLE_ISSUER,
		IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
	}
	for i := 0; ; i++ {
		if flags&(IORING_SETUP_COOP_TASKRUN|IORING_SETUP_DEFER_TASKRUN) == 0 {
			flags &^= IORING_SETUP_TASKRUN_FLAG
		}
		p := &params{Flags: flags, CQEntries: cq}
		fd, err := setup(entries, p)
		if err == nil {
			p.Flags = flags
			return fd, p, nil
		}
		for ; i < len(drops) && flags&drops[i] == 0; i++ {
		}
		if !errors.Is(err, unix.EINVAL) || i >= len(drops) {
			return -1, nil, err
		}
		flags &^= drops[i]
	}
}

// mapRings mmaps the SQ/CQ rings and the SQE array and sets the pointers.
func (r *Ring) mapRings(p *params) error {
	sqSize := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqSize := int(p.CQOff.Cqes) + int(p.CQEntries)*int(unsafe.Sizeof(CQE{}))
	single := p.Features&IORING_FEAT_SINGLE_MMAP != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.ringMem, err = mmapRing(r.fd, IORING_OFF_SQ_RING, sqSize)
	if err != nil {
		return fmt.Errorf("mmap sq ring: %w", err)
	}
	cqMem := r.ringMem
	if !single {
		if r.cqMem, err = mmapRing(r.fd, IORING_OFF_CQ_RING, cqSize); err != nil {
			return fmt.Errorf("mmap cq ring: %w", err)
		}
		cqMem = r.cqMem
	}
	r.sqeShift = 6
	if p.Flags&IORING_SETUP_SQE128 != 0 {
		r.sqeShift = 7
	}
	if r.sqeMem, err = mmapRing(r.fd, IORING_OFF_SQES, int(p.SQEntries)<<r.sqeShift); err != nil {
		return fmt.Errorf("mmap sqes: %w", err)
	}
	sq, cqb := unsafe.Pointer(&r.ringMem[0]), unsafe.Pointer(&cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.sqFlags = (*uint32)(unsafe.Add(sq, p.SQOff.Flags))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqEntries = *(*uint32)(unsafe.Add(sq, p.SQOff.RingEntries))
	r.sqes = unsafe.Pointer(&r.sqeMem[0])
	r.sqLocal = *r.sqTail
	array := unsafe.Slice((*uint32)(unsafe.Add(sq, p.SQOff.Array)), r.sqEntries)
	for i := range array {
		array[i] = uint32(i) // identity: slot i of the array names SQE i
	}
	r.cqHead = (*uint32)(unsafe.Add(cqb, p.CQOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cqb, p.CQOff.Tail))
	r.cqOverflow = (*uint32)(unsafe.Add(cqb, p.CQOff.Overflow))
	r.cqMask = *(*uint32)(unsafe.Add(cqb, p.CQOff.RingMask))
	r.cqEntries = *(*uint32)(unsafe.Add(cqb, p.CQOff.RingEntries))
	r.cqes = unsafe.Add(cqb, p.CQOff.Cqes)
	return nil
}

func mmapRing(fd int, off int64, size int) ([]byte, error) {
	return unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

func (r *Ring) unmap() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.ringMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.ringMem = nil, nil, nil
}

// Close unregisters the ring fd (if registered), unmaps the rings and closes
// the fd. It is idempotent. Call it from the owner thread: a registered ring
// fd belongs to the thread that registered it.
func (r *Ring) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.cleanup.Stop()
	if r.regFD {
		upd := rsrcUpdate{Offset: uint32(r.enterFD)}
		_, _ = register(r.fd, IORING_UNREGISTER_RING_FDS, unsafe.Pointer(&upd), 1)
	}
	r.unmap()
	r.sqHead, r.sqTail, r.sqFlags, r.cqHead, r.cqTail, r.cqOverflow = nil, nil, nil, nil, nil, nil
	if err := unix.Close(r.fd); err != nil {
		return fmt.Errorf("close io_uring: %w", err)
	}
	return nil
}

// FD returns the ring's file descriptor (for MSG_RING or diagnostics).
func (r *Ring) FD() int { return r.fd }

// Flags returns the IORING_SETUP_* flags the kernel accepted.
func (r *Ring) Flags() uint32 { return r.flags }

// Features returns the IORING_FEAT_* bits the kernel reported.
func (r *Ring) Features() uint32 { return r.features }

// SQEntries and CQEntries return the ring sizes the kernel chose.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// CQEntries returns the CQ size the kernel chose.
func (r *Ring) CQEntries() uint32 { return r.cqEntries }

// Enters returns how many io_uring_enter calls this ring has made.
func (r *Ring) Enters() uint64 { return r.enters }

// InFlight returns how many operations the kernel holds whose CQE has not
// been reaped yet.
func (r *Ring) InFlight() uint32 { return r.inflight }

// Pending returns how many prepared SQEs wait in the engine for ring room.
func (r *Ring) Pending() int { return r.pLen }

// Unsubmitted returns how many prepared SQEs the kernel has not consumed
// yet: those in the SQ and those waiting for room in it.
func (r *Ring) Unsubmitted() int { return int(r.unsubmitted()) + r.pLen }
