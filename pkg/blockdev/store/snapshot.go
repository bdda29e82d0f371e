package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// CreateSnapshot snapshots a volume. Idempotent by name: a snapshot of the
// same source volume is returned as it is; one of another volume is
// ErrConflict. A missing source volume is ErrNotFound.
//
// When hold is not nil the volume is in use: it is copied live first, then
// held only while the copy catches up (see copyHeld). The snapshot is as
// consistent as hold makes it: with a frozen filesystem or a device whose
// I/O is held (blockdev.IOHolder), crash-consistent; with hold only
// flushing the device (a raw block loop volume), crash-consistent when the
// catch-up is a reflink, which is atomic against the file's writers, and
// torn across writes made during the catch-up otherwise (the driver refuses
// that case). The snapshot is a file of its own: deleting the volume later
// does not touch it.
func (s *Store) CreateSnapshot(ctx context.Context, name, sourceVolumeID string, hold Hold) (blockdev.Snapshot, error) {
	return s.CreateSnapshotTracked(ctx, name, sourceVolumeID, hold, nil)
}

// CreateSnapshotTracked is CreateSnapshot for a volume whose device may
// record the ranges it changes: while hold holds the volume, cut (nil
// when the backend does not track) cuts the device's record, which is
// saved with the snapshot (changes.go) and put back if the snapshot
// fails.
func (s *Store) CreateSnapshotTracked(ctx context.Context, name, sourceVolumeID string, hold Hold, cut *ChangeCut) (blockdev.Snapshot, error) {
	if err := blockdev.CheckName(name); err != nil {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	if !blockdev.IsVolumeID(sourceVolumeID) {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: source volume %q: %w", name, sourceVolumeID, blockdev.ErrNotFound)
	}
	id := blockdev.SnapshotID(name)
	release, err := s.acquire(ctx, id, sourceVolumeID)
	if err != nil {
		return blockdev.Snapshot{}, err
	}
	defer release()
	if snap, err := s.Snapshot(id); err == nil {
		if snap.SourceVolumeID != sourceVolumeID {
			return snap, fmt.Errorf("snapshot %q exists of volume %s: %w", name, snap.SourceVolumeID, blockdev.ErrConflict)
		}
		return snap, nil
	}
	if err := s.checkQuarantined(id); err != nil {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	v, err := s.Volume(sourceVolumeID)
	if err != nil {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	snap := blockdev.Snapshot{ID: id, Name: name, SourceVolumeID: v.ID, SizeBytes: v.SizeBytes, CreatedAt: time.Now().UTC()}
	if err := s.reserveCopy(id, s.dataFile(v.ID)); err != nil {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	defer s.unreserve(id)
	if err := s.takeSnapshot(ctx, snap, hold, cut); err != nil {
		return blockdev.Snapshot{}, err
	}
	s.mu.Lock()
	s.snapshots[id] = snap
	s.mu.Unlock()
	return snap, nil
}

// reserveCopy reserves the blocks src has allocated: what a snapshot costs
// when it must be copied. (A reflink costs nearly nothing, but whether the
// filesystem can reflink is only known by trying; asking for the copy's
// size keeps the promise Capacity makes to existing volumes.)
func (s *Store) reserveCopy(id, src string) error {
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	return s.reserve(id, st.Blocks*512, false)
}

// takeSnapshot copies the volume file while it is held, cutting its
// device's change record meanwhile, then records the snapshot's changes
// and the snapshot, and starts the volume's next record. Nothing is left
// behind on error, and the cut goes back to the device. Its steps are
// snapshotTake's, which a group snapshot runs for all its members at once
// (group.go).
func (s *Store) takeSnapshot(ctx context.Context, snap blockdev.Snapshot, hold Hold, cut *ChangeCut) error {
	t := s.newTake(snap, hold, cut)
	err := t.copyLive(ctx)
	if err == nil {
		err = t.holdSource(ctx)
	}
	if err == nil {
		err = t.catchUp(ctx)
	}
	if rerr := t.releaseSource(); err == nil {
		err = rerr
	}
	var sc snapshotChanges
	if err == nil {
		sc, err = s.commitTake(t)
	}
	if err != nil {
		err = classify(fmt.Errorf("create snapshot %s: %w", snap.ID, err))
		return errors.Join(err, s.abortTake(t))
	}
	s.restartChanges(t, sc)
	return nil
}

// snapshotTake is one snapshot in the making, in the steps of copyHeld:
// a live copy (copyLive), the source held (holdSource), its device's
// record cut and the copy made exact while it is held (catchUp), the
// source released (releaseSource), then the copy made durable and
// recorded (commitTake), or removed (abortTake).
type snapshotTake struct {
	snap      blockdev.Snapshot
	file, src string
	hold      Hold
	cut       *ChangeCut
	c         heldCut
	release   func() error // set while the source is held
}

func (s *Store) newTake(snap blockdev.Snapshot, hold Hold, cut *ChangeCut) *snapshotTake {
	return &snapshotTake{snap: snap, file: s.dataFile(snap.ID), src: s.dataFile(snap.SourceVolumeID), hold: hold, cut: cut}
}

// copyLive copies the source while it is live (filecopy.CopyFile).
func (t *snapshotTake) copyLive(ctx context.Context) error {
	return filecopy.CopyFile(ctx, t.file, t.src, t.snap.SizeBytes)
}

// holdSource holds the source (nothing for a source not in use).
func (t *snapshotTake) holdSource(ctx context.Context) error {
	if t.hold == nil {
		return nil
	}
	release, err := t.hold(ctx)
	if err != nil {
		return fmt.Errorf("hold source: %w", err)
	}
	t.release = release
	return nil
}

// catchUp cuts the held source's change record and makes the copy exact
// (filecopy.ResyncFile); a source not held needs neither.
func (t *snapshotTake) catchUp(ctx context.Context) error {
	if t.release == nil {
		return nil
	}
	t.c.take(t.cut)
	return filecopy.ResyncFile(ctx, t.file, t.src)
}

// releaseSource lets the held source's writes through again.
func (t *snapshotTake) releaseSource() error {
	if t.release == nil {
		return nil
	}
	release := t.release
	t.release = nil
	if err := release(); err != nil {
		return fmt.Errorf("release source: %w", err)
	}
	return nil
}

// commitTake makes the copy durable and writes the snapshot's change
// record, then its record.
func (s *Store) commitTake(t *snapshotTake) (snapshotChanges, error) {
	if err := filecopy.SyncFile(t.file); err != nil {
		return snapshotChanges{}, err
	}
	sc, err := s.snapshotChanges(t.snap, t.hold != nil, t.c)
	if err == nil {
		err = s.writeChanges(t.snap.ID, sc)
	}
	if err == nil {
		err = s.writeRecord(t.snap.ID, record{State: stateReady, Snapshot: &t.snap})
	}
	return sc, err
}

// abortTake removes what the take made and gives its cut back to the
// device, or keeps it in the volume's record (putBack); an error says
// that the cut is in no record.
func (s *Store) abortTake(t *snapshotTake) error {
	atomicfile.Remove(s.changesPath(t.snap.ID))
	atomicfile.Remove(t.file)
	return s.putBack(t.snap.SourceVolumeID, t.cut, &t.c)
}

// restartChanges starts the source volume's record afresh from the
// snapshot t took, whose change record is sc: trusted while no device
// serves the volume, and on disk untrusted while one does (its tracker
// holds the record in memory). Should this fail, the old record still
// holds (it names the previous snapshot), and the device's must again
// cover everything since that one.
func (s *Store) restartChanges(t *snapshotTake, sc snapshotChanges) {
	next := volumeChanges{Version: changesVersion, Base: t.snap.ID, BaseToken: sc.Token, Trusted: t.hold == nil}
	if err := s.writeChanges(t.snap.SourceVolumeID, next); err != nil {
		_ = s.putBack(t.snap.SourceVolumeID, t.cut, &t.c) // the snapshot stands
	}
}

// heldCut is the cut of a device's change record taken while the volume is
// held for its snapshot.
type heldCut struct {
	exts    []cbt.Extent
	trusted bool
	done    bool
}

// take cuts the device's record (cut, nil when the backend does not
// track) while the volume is held. A cut that fails (the device is not
// tracked) leaves c not done: the snapshot's record is then untrusted.
func (c *heldCut) take(cut *ChangeCut) {
	if cut == nil {
		return
	}
	if exts, trusted, err := cut.Cut(); err == nil {
		c.exts, c.trusted, c.done = exts, trusted, true
	}
}

// putBack returns the cut c of the volume's record to its device when the
// snapshot it was for failed. When no device takes it (the device is gone,
// or handed its record over to the next process), it goes into the
// volume's record on disk instead, untrusted, and the next snapshot's
// record takes it from there (snapshotChanges): the cut's writes are in
// some record either way. The caller holds the volume's guard. The error
// says that the cut is in no record.
func (s *Store) putBack(volumeID string, cut *ChangeCut, c *heldCut) error {
	if !c.done || cut == nil || cut.PutBack == nil {
		return nil
	}
	c.done = false
	perr := cut.PutBack(c.exts, c.trusted)
	if perr == nil {
		return nil
	}
	var vc volumeChanges
	if !s.readChanges(volumeID, &vc) {
		vc = volumeChanges{Version: changesVersion}
	}
	vc.Changes, vc.Trusted = cbt.Union(vc.Changes, c.exts), false
	if err := s.writeChanges(volumeID, vc); err != nil {
		return fmt.Errorf("the snapshot's cut of %s's change record is lost: %w; %w", volumeID, perr, err)
	}
	return nil
}

// snapshotChanges builds the change record of snap: the device's cut when
// one was taken, with the volume's record (what the device started from,
// and any cut no device took back: putBack), else the volume's record,
// trusted only when no device served the volume (inUse false) and the
// record is trusted.
func (s *Store) snapshotChanges(snap blockdev.Snapshot, inUse bool, c heldCut) (snapshotChanges, error) {
	token, err := newToken()
	if err != nil {
		return snapshotChanges{}, fmt.Errorf("snapshot token: %w", err)
	}
	var vc volumeChanges
	known := s.readChanges(snap.SourceVolumeID, &vc)
	sc := snapshotChanges{Version: changesVersion, Volume: snap.SourceVolumeID, Token: token, Size: snap.SizeBytes,
		Prev: vc.Base, PrevToken: vc.BaseToken}
	switch {
	case c.done:
		sc.Changes, sc.Trusted = cbt.Union(c.exts, vc.Changes), c.trusted && known
	case !inUse:
		sc.Changes, sc.Trusted = vc.Changes, known && vc.Trusted
	}
	return sc, nil
}

// DeleteSnapshot removes a snapshot. Unknown and invalid IDs return nil.
// Volumes created from the snapshot are independent and not affected. The
// snapshot's change record is folded into the records that follow it
// (foldChanges), so that deltas across it still come from the records.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if !blockdev.IsSnapshotID(id) {
		return nil
	}
	next := s.followers(id) // their guards too: foldChanges rewrites them
	release, err := s.acquire(ctx, append(next, id)...)
	if err != nil {
		return err
	}
	defer release()
	if _, err := s.Snapshot(id); err != nil {
		return nil
	}
	s.foldChanges(id, next)
	if err := s.deleteObject(id); err != nil {
		return err
	}
	return atomicfile.Remove(s.changesPath(id))
}

// copyHeld makes file a copy of src (or an empty file when src is "") of
// size bytes, synced when durable. When hold is set the source is in use,
// and hold keeps it steady only while the copy catches up, not for the
// whole copy:
//
//  1. copy while the source is live: a reflink, or a sparse copy that may
//     miss writes made meanwhile;
//  2. hold the source (freeze its filesystem, or hold its device's I/O);
//  3. make the copy exact (filecopy.ResyncFile): reflink again where the filesystem
//     can, else compare both files over the source's data and rewrite only
//     the blocks that differ;
//  4. release the source, then make the copy durable.
//
// The held window thus costs a reflink, or a read of the source's data
// and of the copy's (mostly from the page cache the first pass filled) plus
// the writes made during the first pass, instead of the whole copy and
// its sync.
func copyHeld(ctx context.Context, file, src string, size int64, hold Hold, durable bool) error {
	if err := filecopy.CopyFile(ctx, file, src, size); err != nil {
		return err
	}
	if hold != nil && src != "" {
		if err := resyncHeld(ctx, file, src, hold); err != nil {
			return err
		}
	}
	if !durable {
		return nil
	}
	return filecopy.SyncFile(file)
}

// resyncHeld brings file up to date with src while hold keeps src steady.
func resyncHeld(ctx context.Context, file, src string, hold Hold) (err error) {
	release, err := hold(ctx)
	if err != nil {
		return fmt.Errorf("hold source: %w", err)
	}
	defer func() {
		if rerr := release(); rerr != nil && err == nil {
			err = fmt.Errorf("release source: %w", rerr)
		}
	}()
	return filecopy.ResyncFile(ctx, file, src)
}
