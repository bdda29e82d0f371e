package store

import (
	"context"
	"fmt"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// maxChain bounds how many snapshot records Delta follows back from the
// target before it compares the files instead.
const maxChain = 4096

// Allocated returns the extents of the snapshot that hold data (from its
// file's extent map, cbt.Allocated) and its size. A missing snapshot is
// ErrNotFound.
func (s *Store) Allocated(ctx context.Context, id string) ([]cbt.Extent, int64, error) {
	var exts []cbt.Extent
	var size int64
	err := s.withSnapshot(ctx, id, func(snap blockdev.Snapshot) error {
		var err error
		exts, err = cbt.Allocated(ctx, s.dataFile(id), snap.SizeBytes)
		size = snap.SizeBytes
		return err
	})
	return exts, size, err
}

// DeltaMethod says how Delta found its answer.
type DeltaMethod string

const (
	// DeltaTracked: from the change records of the snapshots after the
	// base, without reading data.
	DeltaTracked DeltaMethod = "tracked"
	// DeltaCompared: by comparing the two snapshot files.
	DeltaCompared DeltaMethod = "compared"
)

// Delta returns the ranges in which the target snapshot differs from the
// base, an earlier snapshot of the same volume (normalized, clipped to the
// target's size; past the base's end, the base reads as zeros), the
// target's size, and how it was found: from the change records when every
// snapshot after the base up to the target has a trusted one, otherwise
// by comparing the files. The answer may name ranges that did not change
// (a 64 KiB chunk of which one block was written, a range written with
// the data it held), never leave one out.
//
// With tracked false the records are not consulted: the caller's backend
// does not track its devices (loop), so the files are always compared.
//
// A missing snapshot is ErrNotFound; snapshots of different volumes are
// ErrInvalid. The snapshots are not deleted while Delta runs.
func (s *Store) Delta(ctx context.Context, baseID, targetID string, tracked bool) ([]cbt.Extent, int64, DeltaMethod, error) {
	for _, id := range []string{baseID, targetID} {
		if !blockdev.IsSnapshotID(id) {
			return nil, 0, "", fmt.Errorf("snapshot %q: %w", id, blockdev.ErrNotFound)
		}
	}
	release, err := s.acquire(ctx, baseID, targetID)
	if err != nil {
		return nil, 0, "", err
	}
	defer release()
	base, err := s.Snapshot(baseID)
	if err != nil {
		return nil, 0, "", err
	}
	target, err := s.Snapshot(targetID)
	if err != nil {
		return nil, 0, "", err
	}
	if base.SourceVolumeID != target.SourceVolumeID {
		return nil, 0, "", fmt.Errorf("snapshots %s and %s are of different volumes (%s, %s): %w",
			baseID, targetID, base.SourceVolumeID, target.SourceVolumeID, blockdev.ErrInvalid)
	}
	size := target.SizeBytes
	if exts, ok := s.trackedDelta(base, target); ok && tracked {
		if base.SizeBytes < size {
			// Past the base's end: what the target holds there
			// (nothing of it was in the base).
			grown, err := cbt.Allocated(ctx, s.dataFile(targetID), size)
			if err != nil {
				return nil, 0, "", err
			}
			exts = cbt.Union(exts, cbt.Clip(grown, base.SizeBytes, size))
		}
		return cbt.Clip(exts, 0, size), size, DeltaTracked, nil
	}
	exts, err := cbt.Compare(ctx, s.dataFile(baseID), s.dataFile(targetID), size)
	if err != nil {
		return nil, 0, "", err
	}
	return exts, size, DeltaCompared, nil
}

// trackedDelta unites the change records from the target's back to the
// one that follows the base; ok is false when one of them is missing or
// untrusted, or the chain does not lead to this base (a snapshot deleted
// in between, a base taken after the target or before tracking began).
func (s *Store) trackedDelta(base, target blockdev.Snapshot) ([]cbt.Extent, bool) {
	if base.ID == target.ID {
		return nil, true
	}
	var bc snapshotChanges
	if !s.readChanges(base.ID, &bc) || bc.Volume != base.SourceVolumeID {
		return nil, false
	}
	var lists [][]cbt.Extent
	id, token := target.ID, ""
	for range maxChain {
		var sc snapshotChanges
		if !s.readChanges(id, &sc) || !sc.Trusted || sc.Volume != target.SourceVolumeID {
			return nil, false
		}
		if token != "" && sc.Token != token {
			return nil, false // deleted and taken again since
		}
		lists = append(lists, sc.Changes)
		if sc.Prev == base.ID {
			return cbt.Union(lists...), sc.PrevToken == bc.Token
		}
		if sc.Prev == "" || sc.PrevToken == "" {
			return nil, false
		}
		id, token = sc.Prev, sc.PrevToken
	}
	return nil, false
}
