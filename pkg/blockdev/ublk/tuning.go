package ublk

import (
	"fmt"
	"math/bits"
	"os"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// Tuning limits and defaults. ChooseTuning is the one place the policy is
// applied; its doc comment states it.
const (
	// DefaultMaxIOBytes is max_io_buf_bytes in copy mode: 128 KiB, what
	// the kernel loop device takes per request, keeps a tag's buffer small.
	DefaultMaxIOBytes = 128 << 10
	// ZeroCopyMaxIOBytes is max_io_buf_bytes with zero copy (no buffers).
	ZeroCopyMaxIOBytes = 1 << 20
	// DefaultMemoryBudget is the copy-mode buffer budget of one volume:
	// on 2 CPUs it keeps 2 queues at depth 64 (8 MiB halved the depth to
	// 32, and two fio jobs at queue depth 32 then ran short of tags; the
	// figures are in docs/benchmark-studies.md, "Figures behind code
	// comments"). Buffers are touched lazily and given back when idle, so
	// the budget is resident only during large I/O; what stays is the
	// registered heads, as much as the requests used: up to 16 KiB per
	// tag, 2 MiB per volume of 2 queues x 64 (512 KiB with 4 KiB I/O).
	DefaultMemoryBudget = 16 << 20
	// MaxMemoryBudget caps what explicit overrides may cost.
	MaxMemoryBudget = 256 << 20
	// DefaultMaxQueues caps the automatic queue count.
	DefaultMaxQueues = 4
	// DefaultDepth is the automatic queue depth before the budget applies.
	DefaultDepth = 64
	// MinAutoDepth is the smallest depth the budget may shrink a queue to
	// before it removes queues instead.
	MinAutoDepth = 16
)

// DefaultQueues is the queue count the policy chooses with cpus CPUs.
func DefaultQueues(cpus int) int { return min(cpus, DefaultMaxQueues) }

// TuningInput is what the tuning policy looks at.
type TuningInput struct {
	// CPUs is the number of CPUs the plugin may run on (>= 1).
	CPUs int
	// Queues and Depth are per-volume overrides (StorageClass parameters
	// "queues" and "queueDepth"); zero means choose.
	Queues, Depth int
	// ZeroCopy is true when the device will run without per-tag buffers
	// (AUTO_BUF_REG or SUPPORT_ZERO_COPY negotiated).
	ZeroCopy bool
	// UserCopy is true when the server will copy through /dev/ublkcN
	// (USER_COPY negotiated without zero copy).
	UserCopy bool
	// MemoryBudget is the copy-mode buffer budget in bytes; 0 = default.
	MemoryBudget int64
	// MaxIOBytes overrides max_io_buf_bytes in copy mode (0 = default):
	// a multiple of 4 KiB up to ZeroCopyMaxIOBytes. Zero copy ignores it.
	MaxIOBytes uint32
}

// Tuning is the queue geometry chosen for one device.
type Tuning struct {
	Queues     int    `json:"queues"`
	Depth      int    `json:"depth"`
	MaxIOBytes uint32 `json:"maxIOBytes"`
	// BufferBytes is what the buffers cost at most: Queues × Depth ×
	// MaxIOBytes in copy mode, 0 with zero copy, and with user copy the
	// tag buffers (Queues × Depth × 16 KiB) and PoolBytes.
	BufferBytes int64 `json:"bufferBytes"`
	ZeroCopy    bool  `json:"zeroCopy,omitempty"`
	UserCopy    bool  `json:"userCopy,omitempty"`
	// PoolBytes is, with user copy, the memory the device lends its
	// requests larger than 16 KiB, an equal share per queue (at least
	// MaxIOBytes each): the memory budget.
	PoolBytes int64 `json:"poolBytes,omitempty"`
}

// CopyMode names how the device's data crosses between the kernel and the
// server: "zero-copy" (the backing I/O uses the request's own pages),
// "user-copy" (the server copies through /dev/ublkcN) or "copy" (the
// kernel copies into the server's buffers at FETCH and COMMIT).
func (t Tuning) CopyMode() string {
	switch {
	case t.ZeroCopy:
		return "zero-copy"
	case t.UserCopy:
		return "user-copy"
	}
	return "copy"
}

// ChooseTuning picks the number of queues and the queue depth of a device.
// The policy:
//
//  1. Overrides are validated: queues must be 1..min(CPUs, 4096) (the kernel
//     clamps nr_hw_queues to nr_cpu_ids, so more would be silently lost);
//     depth must be a power of two in 1..4096 (UBLK_MAX_QUEUE_DEPTH). A
//     bad value is an error wrapping os.ErrInvalid, never silently fixed.
//  2. max_io_buf_bytes is 1 MiB with zero copy, and otherwise 1 MiB with
//     user copy and 128 KiB in copy mode, unless overridden (a multiple of
//     4 KiB up to 1 MiB).
//  3. Without overrides: queues = min(CPUs, 4), depth = 64. The queues are
//     served by the shared server threads (one per CPU, SpreadQueues), so
//     they cost no threads of their own. A sweep of fixed settings at 1, 2
//     and 4 VM CPUs found no setting reproducibly better (docs/benchmarks.md).
//  4. Copy mode must fit the memory budget (default 16 MiB per volume,
//     Queues × Depth × max_io_buf_bytes): chosen values shrink, depth first
//     (halving, down to 16), then queues; an overridden value never
//     shrinks. Overrides together may cost at most 256 MiB, else error.
//  5. Zero copy has no buffers, so the budget does not apply.
//  6. User copy keeps 16 KiB per tag (the small requests of random I/O),
//     and larger requests borrow from their queue's share of a pool of
//     the budget (at least one largest request per queue): a queue may
//     have as many bytes of large requests in flight as copy mode's tag
//     buffers hold, in requests of up to 1 MiB. The budget then bounds
//     the memory, not the request size; the tag buffers come on top.
//
// The buffers are mmapped and touched lazily, so the resident cost of a
// volume doing only 4 KiB I/O is far below BufferBytes.
func ChooseTuning(in TuningInput) (Tuning, error) {
	if in.CPUs < 1 {
		return Tuning{}, fmt.Errorf("tuning: cpus %d: %w", in.CPUs, os.ErrInvalid)
	}
	if err := validateOverrides(in); err != nil {
		return Tuning{}, err
	}
	budget := in.MemoryBudget
	if budget <= 0 {
		budget = DefaultMemoryBudget
	}
	t := Tuning{Queues: in.Queues, Depth: in.Depth, MaxIOBytes: DefaultMaxIOBytes, ZeroCopy: in.ZeroCopy, UserCopy: in.UserCopy && !in.ZeroCopy}
	if in.ZeroCopy {
		t.MaxIOBytes = ZeroCopyMaxIOBytes
	} else if in.MaxIOBytes != 0 {
		t.MaxIOBytes = in.MaxIOBytes
	} else if t.UserCopy {
		t.MaxIOBytes = ZeroCopyMaxIOBytes
	}
	if t.Queues == 0 {
		t.Queues = DefaultQueues(in.CPUs)
	}
	if t.Depth == 0 {
		t.Depth = DefaultDepth
	}
	switch {
	case t.ZeroCopy:
		return t, nil
	case t.UserCopy:
		t.PoolBytes = userCopyPool(t, budget)
		t.BufferBytes = userCopyTagBytes(t) + t.PoolBytes
	default:
		fitBudget(&t, in, budget)
		t.BufferBytes = int64(t.Queues) * int64(t.Depth) * int64(t.MaxIOBytes)
	}
	if t.BufferBytes > MaxMemoryBudget {
		return Tuning{}, fmt.Errorf("tuning: %d queues × depth %d with %d-byte requests need %d bytes of buffers, more than %d: %w",
			t.Queues, t.Depth, t.MaxIOBytes, t.BufferBytes, MaxMemoryBudget, os.ErrInvalid)
	}
	return t, nil
}

// userCopyTagBytes is what the tag buffers of a user-copy device cost:
// Queues × Depth × 16 KiB (dataplane.UserCopyTagBytes), or MaxIOBytes per
// tag when that is less.
func userCopyTagBytes(t Tuning) int64 {
	return int64(t.Queues) * int64(t.Depth) * int64(min(t.MaxIOBytes, dataplane.UserCopyTagBytes))
}

// userCopyPool is the pool of a user-copy device: the budget, in whole 16
// KiB chunks per queue, and at least one request of MaxIOBytes per queue;
// none when no request outgrows a tag's buffer.
func userCopyPool(t Tuning, budget int64) int64 {
	if t.MaxIOBytes <= dataplane.UserCopyTagBytes {
		return 0
	}
	chunk := int64(dataplane.UserCopyTagBytes)
	share := budget / int64(t.Queues) / chunk * chunk
	share = max(share, (int64(t.MaxIOBytes)+chunk-1)/chunk*chunk)
	return share * int64(t.Queues)
}

func validateOverrides(in TuningInput) error {
	if in.Queues < 0 || in.Queues > min(in.CPUs, uapi.MaxNrQueues) {
		return fmt.Errorf("tuning: queues %d not in 1..%d: %w", in.Queues, min(in.CPUs, uapi.MaxNrQueues), os.ErrInvalid)
	}
	if in.Depth < 0 || in.Depth > uapi.MaxQueueDepth || (in.Depth > 0 && bits.OnesCount(uint(in.Depth)) != 1) {
		return fmt.Errorf("tuning: queueDepth %d is not a power of two in 1..%d: %w", in.Depth, uapi.MaxQueueDepth, os.ErrInvalid)
	}
	if in.MaxIOBytes%4096 != 0 || in.MaxIOBytes > ZeroCopyMaxIOBytes {
		return fmt.Errorf("tuning: max i/o bytes %d is not a multiple of 4096 up to %d: %w", in.MaxIOBytes, ZeroCopyMaxIOBytes, os.ErrInvalid)
	}
	return nil
}

// fitBudget shrinks the values the caller did not set until the buffers fit.
func fitBudget(t *Tuning, in TuningInput, budget int64) {
	cost := func() int64 { return int64(t.Queues) * int64(t.Depth) * int64(t.MaxIOBytes) }
	for cost() > budget && in.Depth == 0 && t.Depth > MinAutoDepth {
		t.Depth /= 2
	}
	for cost() > budget && in.Queues == 0 && t.Queues > 1 {
		t.Queues--
	}
	for cost() > budget && in.Depth == 0 && t.Depth > 1 {
		t.Depth /= 2
	}
}

// errInvalid classifies bad arguments; the blockdev adapter maps it.
var errInvalid = os.ErrInvalid
