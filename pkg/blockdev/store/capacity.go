package store

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
)

// Capacity reports what the data directory can still provision, after the
// over-provisioning ratio and what existing volumes may still grow into.
//
// Accounting, from statfs of the data directory (free = blocks available to
// unprivileged users less the configured reserve, its bytes plus its ratio of
// the filesystem's size; total = filesystem size):
//   - ratio 1 (no over-provisioning): available = free minus, for every
//     volume, the part of its size not yet allocated on disk (size minus
//     st_blocks*512). Every volume can then be filled completely. Snapshots
//     never grow, so only their allocated blocks count (already in free).
//     Blocks a reflinked clone shares with its source count as allocated
//     for both, so the accounting is optimistic for clones written later.
//   - ratio r > 1: available = free * r and total = total * r; volumes may
//     together promise more than the disk holds.
//
// In both cases the sizes of creates and expansions still in flight are
// subtracted, and available is never negative.
//
// A preallocated volume's blocks are all allocated, so its whole size is
// used, out of free, from its creation on.
func (s *Store) Capacity() (available, total int64, err error) {
	return s.capacity(false)
}

// PreallocatedCapacity reports what the data directory can still provision
// as preallocated volumes: as Capacity, but never over-provisioned, since
// a preallocated volume takes its blocks at once (ratio r > 1: available =
// free, not free * r).
func (s *Store) PreallocatedCapacity() (available int64, err error) {
	available, _, err = s.capacity(true)
	return available, err
}

func (s *Store) capacity(prealloc bool) (available, total int64, err error) {
	st, err := fsstat.Stat(s.cfg.Dir)
	if err != nil {
		return 0, 0, fmt.Errorf("capacity: %w", err)
	}
	total = st.TotalBytes
	free := st.AvailableBytes - s.cfg.ReserveBytes - scale(total, s.cfg.ReserveRatio)
	if r := s.cfg.OverProvisionRatio; r > 1 {
		total = scale(total, r)
		if !prealloc {
			free = scale(free, r)
		}
	} else {
		free -= s.unallocated()
	}
	s.mu.Lock()
	for _, n := range s.reserved {
		free -= n
	}
	s.mu.Unlock()
	return max(free, 0), total, nil
}

// unallocated sums, over volumes, the bytes not yet backed by disk blocks.
func (s *Store) unallocated() int64 {
	var sum int64
	for _, v := range s.Volumes() {
		var st unix.Stat_t
		if unix.Stat(s.dataFile(v.ID), &st) != nil {
			sum += v.SizeBytes // unreadable: assume nothing is allocated
			continue
		}
		if alloc := st.Blocks * 512; alloc < v.SizeBytes {
			sum += v.SizeBytes - alloc
		}
	}
	return sum
}

// reserve promises n bytes to the operation on id, or returns ErrNoSpace;
// prealloc for bytes to be allocated at once (see PreallocatedCapacity).
// capMu makes check-and-reserve atomic across concurrent creates.
func (s *Store) reserve(id string, n int64, prealloc bool) error {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	avail, _, err := s.capacity(prealloc)
	if err != nil {
		return err
	}
	if n > avail {
		return fmt.Errorf("%s needs %d bytes, %d available: %w", id, n, avail, blockdev.ErrNoSpace)
	}
	s.mu.Lock()
	s.reserved[id] = n
	s.mu.Unlock()
	return nil
}

func (s *Store) unreserve(id string) {
	s.mu.Lock()
	delete(s.reserved, id)
	s.mu.Unlock()
}

func scale(n int64, r float64) int64 {
	f := float64(n) * r
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(f)
}
