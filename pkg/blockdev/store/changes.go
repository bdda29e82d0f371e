package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// Changed-block tracking keeps one file per object in <dir>/changes/,
// replaced atomically as the records in meta/ are:
//
//   - <volume-id>.json, the volume's record: the ranges written since its
//     last snapshot (Base) and whether that is all of them (Trusted).
//     BeginTracking marks it untrusted, durably, before a device serves
//     the volume; only a clean hand-over (EndTracking, with the record a
//     detached device kept) or a snapshot taken while no device serves it
//     makes it trusted again. A crash, a restart that re-adopts the device,
//     or a backend that does not track (loop) thus leaves it untrusted.
//     A volume without one (made before tracking, restored, cloned or
//     imported) is untrusted until its first snapshot. It also keeps the
//     cut of a failed snapshot that no device took back (putBack), which
//     the next snapshot's record includes. It is removed before the
//     volume's own record, so that no volume created later under the same
//     ID finds it.
//   - <snapshot-id>.json, the snapshot's record, written before the
//     snapshot's own record: the ranges changed between the volume's
//     previous snapshot (Prev) and this one, whether that is trusted, and
//     a random Token, so that a snapshot deleted and taken again under
//     the same name is never mistaken for the one a later record follows.
//
// Delta answers from the records of every snapshot after the base up to
// the target when each is trusted and they chain back to the base;
// otherwise (an untrusted or missing record, a chain through a snapshot
// whose record was lost) it compares the two files (cbt.Compare). A
// deleted snapshot's record is folded into the one after it, so the chain
// goes on around it; deleting the volume's latest snapshot, whose
// successor is still the volume's own record, breaks it there. Nothing else writes a
// volume's file while no device serves it: a restore, clone or import is
// a new volume, and an expansion adds zeros (Delta also reports what the
// target holds past the base's end).
const changesDir = "changes"

// changesVersion is the format of the files in changes/; a file of
// another version is not trusted.
const changesVersion = 1

// volumeChanges is a volume's record in changes/.
type volumeChanges struct {
	Version   int          `json:"version"`
	Base      string       `json:"base,omitempty"`
	BaseToken string       `json:"baseToken,omitempty"`
	Trusted   bool         `json:"trusted"`
	Changes   []cbt.Extent `json:"changes,omitempty"`
}

// snapshotChanges is a snapshot's record in changes/.
type snapshotChanges struct {
	Version   int          `json:"version"`
	Volume    string       `json:"volume"`
	Token     string       `json:"token"`
	Prev      string       `json:"prev,omitempty"`
	PrevToken string       `json:"prevToken,omitempty"`
	Trusted   bool         `json:"trusted"`
	Size      int64        `json:"size"`
	Changes   []cbt.Extent `json:"changes,omitempty"`
}

// ChangeCut is how CreateSnapshotTracked gets the change record of a
// volume's device, while the volume is held for its snapshot, and gives
// it back when the snapshot fails (a backend's CutChanges and
// PutBackChanges, for the volume). Cut fails when the device is not
// tracked; PutBack fails when no device takes the cut back (it is gone,
// or handed its record over), and the store then keeps it in the
// volume's record (putBack).
type ChangeCut struct {
	Cut     func() (exts []cbt.Extent, trusted bool, err error)
	PutBack func(exts []cbt.Extent, trusted bool) error
}

func (s *Store) changesPath(id string) string {
	return filepath.Join(s.cfg.Dir, changesDir, id+metaSuffix)
}

// readChanges decodes id's file in changes/ into v; ok is false when there
// is none or it does not decode or is of another version (then it is not
// trusted, which is all a reader needs to know).
func (s *Store) readChanges(id string, v any) (ok bool) {
	data, err := os.ReadFile(s.changesPath(id))
	if err != nil {
		return false
	}
	var probe struct {
		Version int `json:"version"`
	}
	if json.Unmarshal(data, &probe) != nil || probe.Version != changesVersion {
		return false
	}
	return json.Unmarshal(data, v) == nil
}

func (s *Store) writeChanges(id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode changes of %s: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Join(s.cfg.Dir, changesDir), 0o700); err != nil {
		return fmt.Errorf("write changes of %s: %w", id, err)
	}
	return atomicfile.WriteFile(s.changesPath(id), append(data, '\n'))
}

// BeginTracking is called before a device serves the volume: it returns
// the volume's record (the ranges written since its last snapshot, and
// whether that is all of them), for a tracking backend to carry on, and
// marks the record untrusted on disk, so that a crash while the device
// serves leaves it so. Idempotent. A missing volume is ErrNotFound.
func (s *Store) BeginTracking(ctx context.Context, volumeID string) (exts []cbt.Extent, trusted bool, err error) {
	release, err := s.acquireVolume(ctx, volumeID)
	if err != nil {
		return nil, false, err
	}
	defer release()
	var vc volumeChanges
	if !s.readChanges(volumeID, &vc) {
		vc = volumeChanges{Version: changesVersion}
	}
	exts, trusted = vc.Changes, vc.Trusted
	if trusted {
		vc.Trusted = false
		if err := s.writeChanges(volumeID, vc); err != nil {
			return nil, false, fmt.Errorf("begin tracking %s: %w", volumeID, err)
		}
	}
	return exts, trusted, nil
}

// EndTracking records what a device that stopped serving the volume
// handed over: every range written since the volume's last snapshot
// (including what BeginTracking gave it) and whether that is all of them.
// A missing volume is ErrNotFound.
func (s *Store) EndTracking(ctx context.Context, volumeID string, exts []cbt.Extent, trusted bool) error {
	release, err := s.acquireVolume(ctx, volumeID)
	if err != nil {
		return err
	}
	defer release()
	var vc volumeChanges
	if !s.readChanges(volumeID, &vc) {
		vc = volumeChanges{Version: changesVersion}
	}
	vc.Changes, vc.Trusted = cbt.Union(exts), trusted
	if err := s.writeChanges(volumeID, vc); err != nil {
		return fmt.Errorf("end tracking %s: %w", volumeID, err)
	}
	return nil
}

// acquireVolume takes the guard of an existing volume.
func (s *Store) acquireVolume(ctx context.Context, id string) (func(), error) {
	if !blockdev.IsVolumeID(id) {
		return nil, fmt.Errorf("volume %q: %w", id, blockdev.ErrNotFound)
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	if _, err := s.Volume(id); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// newToken returns a random token naming one snapshot's record.
func newToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// removeStrayChanges removes the files in changes/ of objects that do not
// exist (a crash between a snapshot's change record and its record, or
// between an object's removal and its change record's).
func (s *Store) removeStrayChanges() error {
	dir := filepath.Join(s.cfg.Dir, changesDir)
	if err := atomicfile.RemoveStale(dir); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), metaSuffix)
		if !ok || !blockdev.ValidID(id) {
			continue
		}
		_, vol := s.volumes[id]
		_, snap := s.snapshots[id]
		if !vol && !snap {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove stray changes: %w", err)
			}
		}
	}
	return atomicfile.SyncDir(dir)
}

// followers returns the snapshots whose change record follows the
// snapshot id's (Prev is id): one, or more where a snapshot's record
// could not restart the volume's (takeSnapshot).
func (s *Store) followers(id string) []string {
	var xc snapshotChanges
	if !s.readChanges(id, &xc) {
		return nil
	}
	var out []string
	for _, snap := range s.Snapshots() {
		var sc snapshotChanges
		if snap.SourceVolumeID == xc.Volume && s.readChanges(snap.ID, &sc) && sc.Prev == id && sc.PrevToken == xc.Token {
			out = append(out, snap.ID)
		}
	}
	return out
}

// foldChanges rewrites the change records of next, the followers of the
// snapshot id that is about to be deleted (the caller holds all their
// guards), to follow id's predecessor instead, with id's changes added:
// trusted only where both were. A follower that no longer follows id is
// left alone. It is written before id goes: a crash in between leaves
// records that skip id while it exists, which only makes a delta from id
// compare files. A fold that fails leaves the follower's record naming
// id, which once id is gone makes deltas across it compare files: never
// a missed change, so it is not an error.
func (s *Store) foldChanges(id string, next []string) {
	var xc snapshotChanges
	if !s.readChanges(id, &xc) {
		return
	}
	for _, y := range next {
		var yc snapshotChanges
		if !s.readChanges(y, &yc) || yc.Prev != id || yc.PrevToken != xc.Token {
			continue
		}
		yc.Prev, yc.PrevToken = xc.Prev, xc.PrevToken
		yc.Changes = cbt.Union(xc.Changes, yc.Changes)
		yc.Trusted = yc.Trusted && xc.Trusted
		_ = s.writeChanges(y, yc)
	}
}
