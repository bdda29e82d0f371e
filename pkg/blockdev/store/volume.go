package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// CreateVolume creates a sparse volume file (or a copy of the source),
// allocated as spec.Preallocation says, and its metadata. Idempotent by
// name: the same spec returns the existing volume; a different size,
// params, source or preallocation returns ErrConflict.
//
// SizeBytes is rounded up to SizeAlign; the returned Volume carries the
// rounded size. With a source, SizeBytes 0 means the source's size, a size
// below the source's is ErrOutOfRange, and a larger one grows the copy. A
// missing source is ErrNotFound; a size the data directory cannot hold (see
// Capacity) is ErrNoSpace.
func (s *Store) CreateVolume(ctx context.Context, spec VolumeSpec) (blockdev.Volume, error) {
	size, srcID, err := checkSpec(spec)
	if err != nil {
		return blockdev.Volume{}, err
	}
	if spec.SourceNode != "" {
		return blockdev.Volume{}, fmt.Errorf("volume %q: its source is on node %s: import it (BeginImport): %w", spec.Name, spec.SourceNode, blockdev.ErrInvalid)
	}
	id := blockdev.VolumeID(spec.Name)
	release, err := s.acquire(ctx, id, srcID)
	if err != nil {
		return blockdev.Volume{}, err
	}
	defer release()
	if v, err := s.Volume(id); err == nil {
		return v, sameVolume(v, spec, size)
	}
	if err := s.checkQuarantined(id); err != nil {
		return blockdev.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, err)
	}
	srcFile, srcSize, err := s.source(srcID)
	if err != nil {
		return blockdev.Volume{}, err
	}
	if size == 0 {
		size = srcSize
	}
	if size < srcSize {
		return blockdev.Volume{}, fmt.Errorf("size %d below the source's %d: %w", size, srcSize, blockdev.ErrOutOfRange)
	}
	if err := s.reserve(id, size, spec.Preallocation != blockdev.PreallocOff); err != nil {
		return blockdev.Volume{}, err
	}
	defer s.unreserve(id)
	v := blockdev.Volume{
		ID: id, Name: spec.Name, SizeBytes: size, Params: maps.Clone(spec.Params), MutableParams: maps.Clone(spec.MutableParams),
		SourceSnapshotID: spec.SourceSnapshotID, SourceVolumeID: spec.SourceVolumeID,
		CreatedAt: time.Now().UTC(), Preallocation: spec.Preallocation, HandoffPeer: spec.HandoffPeer,
	}
	hold := spec.Hold
	if spec.SourceVolumeID == "" {
		hold = nil // snapshots are not in use
	}
	if err := s.commitFile(ctx, id, srcFile, size, hold, record{State: stateReady, Volume: &v}); err != nil {
		return blockdev.Volume{}, err
	}
	s.mu.Lock()
	s.volumes[id] = v
	s.mu.Unlock()
	return copyVolume(v), nil
}

// checkSpec validates a spec and returns its rounded size and source ID.
func checkSpec(spec VolumeSpec) (size int64, srcID string, err error) {
	if err := blockdev.CheckName(spec.Name); err != nil {
		return 0, "", fmt.Errorf("volume %q: %w", spec.Name, err)
	}
	if spec.SourceSnapshotID != "" && spec.SourceVolumeID != "" {
		return 0, "", fmt.Errorf("volume %q: both a snapshot and a volume source: %w", spec.Name, blockdev.ErrInvalid)
	}
	srcID = spec.SourceSnapshotID + spec.SourceVolumeID
	if srcID == "" && spec.SizeBytes == 0 {
		return 0, "", fmt.Errorf("volume %q: no size: %w", spec.Name, blockdev.ErrInvalid)
	}
	size, err = blockdev.RoundSize(spec.SizeBytes)
	if err != nil {
		return 0, "", fmt.Errorf("volume %q: %w", spec.Name, err)
	}
	switch {
	case spec.SourceSnapshotID != "" && !blockdev.IsSnapshotID(srcID),
		spec.SourceVolumeID != "" && !blockdev.IsVolumeID(srcID):
		return 0, "", fmt.Errorf("source %q: %w", srcID, blockdev.ErrNotFound)
	}
	return size, srcID, nil
}

// sameVolume answers a repeated create: nil when spec matches v, ErrConflict
// otherwise. A spec without a size (from a source) matches any size.
func sameVolume(v blockdev.Volume, spec VolumeSpec, size int64) error {
	switch {
	case size != 0 && size != v.SizeBytes:
		return fmt.Errorf("volume %q exists with size %d, not %d: %w", v.Name, v.SizeBytes, size, blockdev.ErrConflict)
	case !maps.Equal(identityParams(v.Params), identityParams(spec.Params)):
		return fmt.Errorf("volume %q exists with other parameters: %w", v.Name, blockdev.ErrConflict)
	case v.SourceSnapshotID != spec.SourceSnapshotID || v.SourceVolumeID != spec.SourceVolumeID || v.SourceNode != spec.SourceNode:
		return fmt.Errorf("volume %q exists with another source: %w", v.Name, blockdev.ErrConflict)
	case v.Preallocation != spec.Preallocation:
		return fmt.Errorf("volume %q exists with preallocation %q, not %q: %w", v.Name, v.Preallocation, spec.Preallocation, blockdev.ErrConflict)
	}
	return nil
}

// identityParams returns params without the claim metadata the provisioner
// adds with --extra-create-metadata: it names the claim, not the volume, so
// a request retried across a change of that flag (an upgrade of the chart)
// still finds the volume it created.
func identityParams(params map[string]string) map[string]string {
	if _, ok := params[blockdev.ParamPVCName]; !ok {
		if _, ok := params[blockdev.ParamPVCNamespace]; !ok {
			if _, ok := params[blockdev.ParamPVName]; !ok {
				return params
			}
		}
	}
	p := maps.Clone(params)
	delete(p, blockdev.ParamPVCName)
	delete(p, blockdev.ParamPVCNamespace)
	delete(p, blockdev.ParamPVName)
	return p
}

// source returns the data file and size of the source ID ("" for none).
// The caller holds the source's guard.
func (s *Store) source(id string) (file string, size int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		return "", 0, nil
	}
	if v, ok := s.volumes[id]; ok {
		return s.dataFile(id), v.SizeBytes, nil
	}
	if snap, ok := s.snapshots[id]; ok {
		return s.dataFile(id), snap.SizeBytes, nil
	}
	return "", 0, fmt.Errorf("source %q: %w", id, blockdev.ErrNotFound)
}

// commitFile makes id's data file (empty, or a copy of src, held by hold)
// of size bytes, allocated all through when r is a preallocated volume's,
// then writes its record. On error nothing of id is left behind; a crash
// leaves a data file without a record, which Open removes.
func (s *Store) commitFile(ctx context.Context, id, src string, size int64, hold Hold, r record) error {
	file := s.dataFile(id)
	err := copyHeld(ctx, file, src, size, hold, true)
	if err == nil && r.Volume != nil && r.Volume.Preallocated() {
		// After the copy: its resync punches the holes of the source.
		err = filecopy.Allocate(file, 0, size, r.Volume.Preallocation == blockdev.PreallocFull)
	}
	if err == nil {
		err = s.writeRecord(id, r)
	}
	if err != nil {
		os.Remove(file)
		return classify(fmt.Errorf("create %s: %w", id, err))
	}
	return nil
}

// classify adds ErrNoSpace to errors that mean the disk is full.
func classify(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", blockdev.ErrNoSpace, err)
	}
	return err
}

// DeleteVolume removes the volume's file and metadata. Unknown and invalid
// IDs return nil. A volume whose node state says it is staged or attached
// returns ErrBusy. Snapshots of the volume are independent files and do not
// block deletion.
//
// Before anything is removed, detach (Backend.Detach; nil when no backend
// can hold the volume) removes any device still serving the volume that
// its record does not name: one attached just before a crash, before the
// record said so. Left behind, it would pin the deleted file's space and
// could serve a new volume of the same ID from the old file. Its error
// (ErrBusy for a device in use) fails the deletion, with nothing removed.
func (s *Store) DeleteVolume(ctx context.Context, id string, detach func(ctx context.Context, volumeID string) error) error {
	if !blockdev.IsVolumeID(id) {
		return nil
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	v, err := s.Volume(id)
	if err != nil {
		return nil
	}
	if v.Node.StagingPath != "" || v.Node.Device != "" {
		return fmt.Errorf("delete volume %s: staged at %q on %q: %w", id, v.Node.StagingPath, v.Node.Device, blockdev.ErrBusy)
	}
	if detach != nil {
		if err := detach(ctx, id); err != nil {
			return fmt.Errorf("delete volume %s: detach a device left behind: %w", id, err)
		}
	}
	// The change record goes first: one left behind by a volume that is
	// gone would be taken by a new volume of the same ID for its own.
	if err := atomicfile.Remove(s.changesPath(id)); err != nil {
		return fmt.Errorf("delete volume %s: its change record: %w", id, err)
	}
	return s.deleteObject(id)
}

// deleteObject removes the record (the object is gone from then on), then
// the data file; a crash in between leaves an orphan file Open removes.
func (s *Store) deleteObject(id string) error {
	if err := atomicfile.Remove(s.metaPath(id)); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.volumes, id)
	delete(s.snapshots, id)
	s.mu.Unlock()
	if err := atomicfile.Remove(s.dataFile(id)); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

// UpdateNode replaces the volume's node state durably.
func (s *Store) UpdateNode(ctx context.Context, id string, ns blockdev.NodeState) (blockdev.Volume, error) {
	return s.update(ctx, id, func(v *blockdev.Volume) error {
		ns.Targets = maps.Clone(ns.Targets)
		v.Node = ns
		return nil
	})
}

// ModifyVolume sets the volume's mutable parameters durably: each of params
// replaces the one of the same name, an empty value removes it.
func (s *Store) ModifyVolume(ctx context.Context, id string, params map[string]string) (blockdev.Volume, error) {
	return s.update(ctx, id, func(v *blockdev.Volume) error {
		*v = v.WithMutableParams(params)
		return nil
	})
}

// AdoptHandoff clears the volume's HandoffPeer durably: its PV came.
func (s *Store) AdoptHandoff(ctx context.Context, id string) (blockdev.Volume, error) {
	return s.update(ctx, id, func(v *blockdev.Volume) error {
		v.HandoffPeer = ""
		return nil
	})
}

// ExpandVolume grows the volume file to at least sizeBytes (rounded up to
// SizeAlign), allocating the new range of a preallocated volume; it never
// shrinks, and a size at or below the current one returns the volume
// unchanged. Growth beyond Capacity (PreallocatedCapacity for a
// preallocated volume) is ErrNoSpace, and so is a full disk, which leaves
// the file at its old size.
func (s *Store) ExpandVolume(ctx context.Context, id string, sizeBytes int64) (blockdev.Volume, error) {
	size, err := blockdev.RoundSize(sizeBytes)
	if err != nil {
		return blockdev.Volume{}, fmt.Errorf("expand volume %s: %w", id, err)
	}
	return s.update(ctx, id, func(v *blockdev.Volume) error {
		if size <= v.SizeBytes {
			return nil
		}
		if err := s.reserve(id, size-v.SizeBytes, v.Preallocated()); err != nil {
			return err
		}
		defer s.unreserve(id)
		grow := filecopy.GrowFile
		if v.Preallocated() {
			// From the recorded size: a crash after an earlier
			// attempt may have left the file longer than that,
			// with or without its blocks.
			grow = func(file string, size int64) error {
				return filecopy.Allocate(file, v.SizeBytes, size, v.Preallocation == blockdev.PreallocFull)
			}
		}
		if err := grow(s.dataFile(id), size); err != nil {
			return classify(fmt.Errorf("expand volume %s: %w", id, err))
		}
		v.SizeBytes = size
		return nil
	})
}

// update applies fn to a copy of the volume under its guard and persists
// the result before publishing it.
func (s *Store) update(ctx context.Context, id string, fn func(*blockdev.Volume) error) (blockdev.Volume, error) {
	if !blockdev.IsVolumeID(id) {
		return blockdev.Volume{}, fmt.Errorf("volume %q: %w", id, blockdev.ErrNotFound)
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return blockdev.Volume{}, err
	}
	defer release()
	v, err := s.Volume(id)
	if err != nil {
		return blockdev.Volume{}, err
	}
	if err := fn(&v); err != nil {
		return blockdev.Volume{}, err
	}
	if err := s.writeRecord(id, record{State: stateReady, Volume: &v}); err != nil {
		return blockdev.Volume{}, classify(err)
	}
	s.mu.Lock()
	s.volumes[id] = v
	s.mu.Unlock()
	return copyVolume(v), nil
}
