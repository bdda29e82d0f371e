package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// A group snapshot is snapshots of several volumes of this data directory
// taken at one instant: every member is copied live, then every member is
// held (its filesystem frozen, its device's I/O held), then each member's
// change record is cut and its copy made exact, then all are released.
// A write that completed in one member before another's copy ends is in
// the snapshots only if every write completed before it is too, so a
// database's data and its log restore to a state the database wrote.
//
// The group's record (meta/<group-id>.json) is written "creating", naming
// its members, before anything else, and "ready" after every member's
// record. Open removes a creating group with its members' files and
// records (a crash mid-way), so a retry makes the group afresh. Each
// member is an ordinary snapshot (its own change record, restores, deltas)
// that names its group (blockdev.Snapshot.GroupID); its name, and so its
// ID, derives from the group's ID and the volume's
// (blockdev.GroupMemberName), so a retried create lands on the same
// snapshots.

// GroupSource is one volume of a group snapshot: how to hold it steady
// while it is copied (nil when it is not in use) and how to cut its
// device's change record (nil when the backend does not track), as for
// CreateSnapshotTracked.
type GroupSource struct {
	VolumeID string
	Hold     Hold
	Cut      *ChangeCut
}

// planGroup returns the group named name of the sources' volumes, members
// sorted by volume ID, or ErrInvalid for no source, an ID that is not a
// volume's, or a volume named twice.
func planGroup(name string, sources []GroupSource) (blockdev.GroupSnapshot, map[string]GroupSource, error) {
	g := blockdev.GroupSnapshot{ID: blockdev.GroupSnapshotID(name), Name: name}
	if len(sources) == 0 {
		return g, nil, fmt.Errorf("group snapshot %q: no volumes: %w", name, blockdev.ErrInvalid)
	}
	bySource := make(map[string]GroupSource, len(sources))
	for _, src := range sources {
		if !blockdev.IsVolumeID(src.VolumeID) {
			return g, nil, fmt.Errorf("group snapshot %q: volume %q: %w", name, src.VolumeID, blockdev.ErrNotFound)
		}
		if _, dup := bySource[src.VolumeID]; dup {
			return g, nil, fmt.Errorf("group snapshot %q: volume %s named twice: %w", name, src.VolumeID, blockdev.ErrInvalid)
		}
		bySource[src.VolumeID] = src
	}
	for _, vid := range slices.Sorted(maps.Keys(bySource)) {
		g.Members = append(g.Members, blockdev.GroupMember{VolumeID: vid, SnapshotID: blockdev.SnapshotID(blockdev.GroupMemberName(g.ID, vid))})
	}
	return g, bySource, nil
}

// CreateGroupSnapshot snapshots the sources' volumes at one instant (see
// the top of this file). Idempotent by name: a group of the same volumes
// is returned as it is, one of other volumes is ErrConflict. A missing
// volume is ErrNotFound. On error nothing of the group is left and every
// cut goes back to its device.
func (s *Store) CreateGroupSnapshot(ctx context.Context, name string, sources []GroupSource) (blockdev.GroupSnapshot, error) {
	if err := blockdev.CheckName(name); err != nil {
		return blockdev.GroupSnapshot{}, fmt.Errorf("group snapshot %q: %w", name, err)
	}
	g, bySource, err := planGroup(name, sources)
	if err != nil {
		return blockdev.GroupSnapshot{}, err
	}
	ids := []string{g.ID}
	for _, m := range g.Members {
		ids = append(ids, m.VolumeID, m.SnapshotID)
	}
	release, err := s.acquire(ctx, ids...)
	if err != nil {
		return blockdev.GroupSnapshot{}, err
	}
	defer release()
	if have, err := s.GroupSnapshot(g.ID); err == nil {
		if !slices.Equal(have.Members, g.Members) {
			return have, fmt.Errorf("group snapshot %q exists of other volumes: %w", name, blockdev.ErrConflict)
		}
		return have, nil
	}
	if err := s.checkNewGroup(g); err != nil {
		return blockdev.GroupSnapshot{}, err
	}
	g.CreatedAt = time.Now().UTC()
	takes := make([]*snapshotTake, len(g.Members))
	for i, m := range g.Members {
		v, _ := s.Volume(m.VolumeID)
		snap := blockdev.Snapshot{ID: m.SnapshotID, Name: blockdev.GroupMemberName(g.ID, m.VolumeID), SourceVolumeID: m.VolumeID,
			SizeBytes: v.SizeBytes, CreatedAt: g.CreatedAt, GroupID: g.ID}
		if err := s.reserveCopy(snap.ID, s.dataFile(v.ID)); err != nil {
			return blockdev.GroupSnapshot{}, fmt.Errorf("group snapshot %q: %w", name, err)
		}
		defer s.unreserve(snap.ID)
		src := bySource[m.VolumeID]
		takes[i] = s.newTake(snap, src.Hold, src.Cut)
	}
	if err := s.writeRecord(g.ID, record{State: stateCreating, Group: &g}); err != nil {
		return blockdev.GroupSnapshot{}, classify(fmt.Errorf("group snapshot %q: %w", name, err))
	}
	if err := s.takeGroup(ctx, g, takes); err != nil {
		return blockdev.GroupSnapshot{}, classify(fmt.Errorf("group snapshot %q: %w", name, err))
	}
	return g, nil
}

// checkNewGroup refuses to make g when one of its IDs is quarantined or
// one of its members' IDs is a snapshot of its own, and fails with
// ErrNotFound for a missing volume.
func (s *Store) checkNewGroup(g blockdev.GroupSnapshot) error {
	if err := s.checkQuarantined(g.ID); err != nil {
		return fmt.Errorf("group snapshot %q: %w", g.Name, err)
	}
	for _, m := range g.Members {
		if _, err := s.Volume(m.VolumeID); err != nil {
			return fmt.Errorf("group snapshot %q: %w", g.Name, err)
		}
		if err := s.checkQuarantined(m.SnapshotID); err != nil {
			return fmt.Errorf("group snapshot %q: %w", g.Name, err)
		}
		if _, err := s.Snapshot(m.SnapshotID); err == nil {
			return fmt.Errorf("group snapshot %q: its snapshot of %s (%s) exists apart from it: %w", g.Name, m.VolumeID, m.SnapshotID, blockdev.ErrConflict)
		}
	}
	return nil
}

// takeGroup takes the members' snapshots (takes, in g's order) at one
// instant, records them and then g as ready, and starts each volume's
// next change record. On error it removes the members and g's record and
// puts every cut back.
func (s *Store) takeGroup(ctx context.Context, g blockdev.GroupSnapshot, takes []*snapshotTake) error {
	err := eachTake(takes, func(t *snapshotTake) error { return t.copyLive(ctx) })
	if err == nil {
		err = eachTake(takes, func(t *snapshotTake) error { return t.holdSource(ctx) })
	}
	if err == nil {
		err = eachTake(takes, func(t *snapshotTake) error { return t.catchUp(ctx) })
	}
	for _, t := range slices.Backward(takes) {
		if rerr := t.releaseSource(); err == nil && rerr != nil {
			err = fmt.Errorf("volume %s: %w", t.snap.SourceVolumeID, rerr)
		}
	}
	changes := make([]snapshotChanges, len(takes))
	for i, t := range takes {
		if err != nil {
			break
		}
		if changes[i], err = s.commitTake(t); err != nil {
			err = fmt.Errorf("volume %s: %w", t.snap.SourceVolumeID, err)
		}
	}
	if err == nil {
		err = s.writeRecord(g.ID, record{State: stateReady, Group: &g})
	}
	if err != nil {
		for _, t := range takes {
			err = errors.Join(err, s.abortTake(t))
			atomicfile.Remove(s.metaPath(t.snap.ID))
		}
		// Should this fail, the record stays "creating": Open, or the
		// next create of the group, removes what is left.
		atomicfile.Remove(s.metaPath(g.ID))
		return err
	}
	s.mu.Lock()
	for _, t := range takes {
		s.snapshots[t.snap.ID] = t.snap
	}
	s.groups[g.ID] = g
	s.mu.Unlock()
	for i, t := range takes {
		s.restartChanges(t, changes[i])
	}
	return nil
}

// eachTake runs step for each take in turn, stopping at the first error,
// which names the take's volume.
func eachTake(takes []*snapshotTake, step func(*snapshotTake) error) error {
	for _, t := range takes {
		if err := step(t); err != nil {
			return fmt.Errorf("volume %s: %w", t.snap.SourceVolumeID, err)
		}
	}
	return nil
}

// GroupSnapshot returns the group snapshot's record or ErrNotFound (also
// for IDs that are not valid group snapshot IDs).
func (s *Store) GroupSnapshot(id string) (blockdev.GroupSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[id]
	if !ok {
		return blockdev.GroupSnapshot{}, fmt.Errorf("group snapshot %q: %w", id, blockdev.ErrNotFound)
	}
	g.Members = slices.Clone(g.Members)
	return g, nil
}

// DeleteGroupSnapshot removes a group snapshot: its members (as
// DeleteSnapshot removes a snapshot), then its record. Unknown and
// invalid IDs return nil. A crash or an error part way leaves the group
// with fewer members; deleting it again finishes.
func (s *Store) DeleteGroupSnapshot(ctx context.Context, id string) error {
	if !blockdev.IsGroupSnapshotID(id) {
		return nil
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	g, err := s.GroupSnapshot(id)
	if err != nil {
		return nil
	}
	for _, m := range g.Members {
		if err := s.DeleteSnapshot(ctx, m.SnapshotID); err != nil {
			return fmt.Errorf("delete group snapshot %s: member %s: %w", id, m.SnapshotID, err)
		}
	}
	if err := atomicfile.Remove(s.metaPath(id)); err != nil {
		return fmt.Errorf("delete group snapshot %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.groups, id)
	s.mu.Unlock()
	return nil
}

// removeHalfGroup removes the members of a group whose record says
// "creating" (a crash, or a cleanup that failed, left it), then its
// record, and forgets the members in recs. A member whose record is
// quarantined is left to the operator, as every quarantined object is.
func (s *Store) removeHalfGroup(g blockdev.GroupSnapshot, recs map[string]record) error {
	for _, m := range g.Members {
		if _, held := s.quarantined[m.SnapshotID]; held {
			continue
		}
		if err := atomicfile.Remove(s.changesPath(m.SnapshotID)); err != nil {
			return err
		}
		if err := s.removeObject(m.SnapshotID); err != nil {
			return err
		}
		delete(recs, m.SnapshotID)
	}
	return atomicfile.Remove(s.metaPath(g.ID))
}
