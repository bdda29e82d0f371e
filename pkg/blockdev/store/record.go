package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// Metadata is one JSON file per object, meta/<id>.json, holding a record.
// Files are replaced atomically: write a temp file (tempPrefix*) in meta/,
// fsync it, rename it over the record, fsync meta/. A reader therefore sees
// either the old or the new record, never a torn one, and a record that
// exists after a crash was acknowledged. Temp files older than
// atomicfile.StaleAge are removed when the Store opens.
//
// A record that cannot be decoded, or decodes into something that is not
// a complete object (see record.validate), is quarantined: renamed to
// meta/<id>.json.corrupt-<time>, never deleted. Either is a disk or
// filesystem fault or a hand edit, and which object the bytes meant is
// unknown. The Store serves every other object, reports the set-aside
// files (Quarantined), keeps the object's data file, and refuses to make a
// new object with its ID, until an operator restores or removes the file.
const (
	tempPrefix  = atomicfile.TempPrefix
	metaSuffix  = ".json"
	imgSuffix   = blockdev.ImageSuffix
	corruptMark = ".corrupt-"

	stateReady    = "ready"
	stateCreating = "creating"
)

// record is the on-disk form of one object. State is "ready" for every
// record the Store writes today. "creating" marks a half-made object (a
// record written before its data file is complete) that Open removes
// with its data file. The Store has never written another state, so any
// other one is corruption, and the record is quarantined.
type record struct {
	State    string                  `json:"state"`
	Volume   *blockdev.Volume        `json:"volume,omitempty"`
	Snapshot *blockdev.Snapshot      `json:"snapshot,omitempty"`
	Group    *blockdev.GroupSnapshot `json:"group,omitempty"`
}

// errCorrupt marks a record that was read but does not decode into the
// object its name says.
var errCorrupt = errors.New("corrupt record")

func (s *Store) metaPath(id string) string { return filepath.Join(s.cfg.Dir, "meta", id+metaSuffix) }

func (s *Store) writeRecord(id string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", id, err)
	}
	return atomicfile.WriteFile(s.metaPath(id), append(data, '\n'))
}

// readRecords loads every record in meta/, removing stale temp files and
// half-made records (with their data files), and quarantining records that
// do not decode or are not valid. It returns ready records by ID and fills
// s.quarantined.
func (s *Store) readRecords() (map[string]record, error) {
	dir := filepath.Join(s.cfg.Dir, "meta")
	if err := atomicfile.RemoveStale(dir); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	recs := make(map[string]record)
	var halfGroups []blockdev.GroupSnapshot
	for _, e := range ents {
		name := e.Name()
		if id, _, ok := strings.Cut(name, metaSuffix+corruptMark); ok && blockdev.ValidID(id) {
			s.quarantined[id] = filepath.Join(dir, name)
			continue
		}
		id, ok := strings.CutSuffix(name, metaSuffix)
		if !ok || !blockdev.ValidID(id) {
			continue // a temp file, or not ours: leave it alone
		}
		r, err := s.readRecord(id)
		if err != nil {
			if err := s.quarantine(id, err); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case r.State == stateCreating && r.Group != nil:
			halfGroups = append(halfGroups, *r.Group) // once every member is read
		case r.State == stateCreating:
			if err := s.removeObject(id); err != nil {
				return nil, err
			}
		default:
			recs[id] = r
		}
	}
	for _, g := range halfGroups {
		if err := s.removeHalfGroup(g, recs); err != nil {
			return nil, err
		}
	}
	return recs, atomicfile.SyncDir(dir)
}

// quarantine sets aside the record of id that could not be loaded (cause):
// one that does not decode is renamed aside; one that cannot be read is
// left in place, to be read again at the next start. Either way the ID is
// held (s.quarantined) so that its data file is neither removed nor
// reused.
func (s *Store) quarantine(id string, cause error) error {
	path := s.metaPath(id)
	if errors.Is(cause, errCorrupt) {
		set := path + corruptMark + time.Now().UTC().Format("20060102T150405.000000000Z")
		if err := os.Rename(path, set); err != nil {
			return fmt.Errorf("set aside %s: %w (after %w)", path, err, cause)
		}
		path = set
	}
	s.quarantined[id] = path
	s.quarantineCauses[path] = cause
	return nil
}

func (s *Store) readRecord(id string) (record, error) {
	var r record
	data, err := os.ReadFile(s.metaPath(id))
	if err != nil {
		return r, fmt.Errorf("read record %s: %w", id, err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("decode record %s: %w: %w", s.metaPath(id), errCorrupt, err)
	}
	if err := r.validate(id); err != nil {
		return r, fmt.Errorf("record %s: %w: %w", s.metaPath(id), errCorrupt, err)
	}
	return r, nil
}

// validate returns why r is not a complete record of the object id, or
// nil: a known state, and exactly the object id names, itself valid.
func (r record) validate(id string) error {
	if r.State != stateReady && r.State != stateCreating {
		return fmt.Errorf("unknown state %q", r.State)
	}
	switch kinds := btoi(r.Volume != nil) + btoi(r.Snapshot != nil) + btoi(r.Group != nil); {
	case kinds != 1:
	case blockdev.IsVolumeID(id) && r.Volume != nil:
		return validateVolume(*r.Volume, id)
	case blockdev.IsSnapshotID(id) && r.Snapshot != nil:
		return validateSnapshot(*r.Snapshot, id)
	case blockdev.IsGroupSnapshotID(id) && r.Group != nil:
		return validateGroup(*r.Group, id)
	}
	return fmt.Errorf("does not describe %s", id)
}

// validateVolume returns why v is not a complete record of the volume id, or
// nil. It accepts what CreateVolume and the updates after it write, in
// this release and the earlier ones (the fields and rules are unchanged
// since the first, but for preallocation, added later and absent from
// older records):
//   - ID is id, and Name is a name CreateVolume accepts whose ID is id: a
//     record under another name's ID would answer for a volume it is not
//     (a create of its name would not find it, one of the other name
//     would take its data file);
//   - SizeBytes is what RoundSize gives, and positive: devices are made of
//     whole 4 KiB blocks, and no volume is empty;
//   - at most one source, an ID of its kind (never a path);
//   - a known preallocation (none before it existed);
//   - no negative tuning;
//   - the node paths it was staged and published at are absolute (the
//     node service unmounts and freezes them; a relative one would act on
//     whatever the plugin's working directory holds).
//
// CreatedAt is not checked: it is only reported, and a record without it
// still says all that is needed to serve its data.
func validateVolume(v blockdev.Volume, id string) error {
	if err := checkObject("volume", v.ID, id, blockdev.VolumeID(v.Name), v.Name, v.SizeBytes); err != nil {
		return err
	}
	switch {
	case v.SourceSnapshotID != "" && v.SourceVolumeID != "":
		return fmt.Errorf("volume %s: two sources", id)
	case v.SourceSnapshotID != "" && !blockdev.IsSnapshotID(v.SourceSnapshotID):
		return fmt.Errorf("volume %s: source snapshot %q is not a snapshot ID", id, v.SourceSnapshotID)
	case v.SourceVolumeID != "" && !blockdev.IsVolumeID(v.SourceVolumeID):
		return fmt.Errorf("volume %s: source volume %q is not a volume ID", id, v.SourceVolumeID)
	case v.SourceNode != "" && (v.SourceSnapshotID+v.SourceVolumeID == "" || !validNodeTag(v.SourceNode)):
		return fmt.Errorf("volume %s: source node %q without a source or not a node tag", id, v.SourceNode)
	}
	switch v.Preallocation {
	case blockdev.PreallocOff, blockdev.PreallocFalloc, blockdev.PreallocFull:
	default:
		return fmt.Errorf("volume %s: unknown preallocation %q", id, v.Preallocation)
	}
	if t := v.Node.Tuning; t.Queues < 0 || t.QueueDepth < 0 || t.MaxIOBytes < 0 {
		return fmt.Errorf("volume %s: negative tuning %+v", id, t)
	}
	if p := v.Node.StagingPath; p != "" && !absPath(p) {
		return fmt.Errorf("volume %s: staging path %q is not absolute", id, p)
	}
	for p := range v.Node.Targets {
		if !absPath(p) {
			return fmt.Errorf("volume %s: target path %q is not absolute", id, p)
		}
	}
	return nil
}

// validNodeTag reports whether tag can be a node's tag in CSI IDs: at
// most 94 bytes (what an ID of 128 leaves), printable, no slash. It is
// only ever shown, never a path; the check keeps a record honest.
func validNodeTag(tag string) bool {
	if len(tag) > 94 {
		return false
	}
	for _, c := range []byte(tag) {
		if c <= ' ' || c > '~' || c == '/' {
			return false
		}
	}
	return true
}

// absPath reports whether p is an absolute path without NUL bytes.
func absPath(p string) bool { return filepath.IsAbs(p) && strings.IndexByte(p, 0) < 0 }

// validateSnapshot returns why sn is not a complete record of the snapshot id, or
// nil: as for a volume, its name derives its ID and its size is a
// positive rounded size (the source volume's); and it names the volume it
// was taken of (which may have been deleted since).
func validateSnapshot(sn blockdev.Snapshot, id string) error {
	if err := checkObject("snapshot", sn.ID, id, blockdev.SnapshotID(sn.Name), sn.Name, sn.SizeBytes); err != nil {
		return err
	}
	if !blockdev.IsVolumeID(sn.SourceVolumeID) {
		return fmt.Errorf("snapshot %s: source volume %q is not a volume ID", id, sn.SourceVolumeID)
	}
	if sn.GroupID != "" && sn.Name != memberName(sn.GroupID, sn.SourceVolumeID) {
		return fmt.Errorf("snapshot %s: group %q is not the group its name %q says", id, sn.GroupID, sn.Name)
	}
	return nil
}

// validateGroup returns why g is not a complete record of the group
// snapshot id, or nil: its name derives its ID, and it has members, each
// a volume named once, with the snapshot ID its name derives.
func validateGroup(g blockdev.GroupSnapshot, id string) error {
	if g.ID != id {
		return fmt.Errorf("group snapshot %s: recorded as %q", id, g.ID)
	}
	if err := blockdev.CheckName(g.Name); err != nil {
		return fmt.Errorf("group snapshot %s: %w", id, err)
	}
	if blockdev.GroupSnapshotID(g.Name) != id {
		return fmt.Errorf("group snapshot %s: name %q derives %s", id, g.Name, blockdev.GroupSnapshotID(g.Name))
	}
	if len(g.Members) == 0 {
		return fmt.Errorf("group snapshot %s: no members", id)
	}
	for i, m := range g.Members {
		if !blockdev.IsVolumeID(m.VolumeID) || (i > 0 && m.VolumeID <= g.Members[i-1].VolumeID) {
			return fmt.Errorf("group snapshot %s: member volume %q not a volume ID in order", id, m.VolumeID)
		}
		if m.SnapshotID != blockdev.SnapshotID(memberName(id, m.VolumeID)) {
			return fmt.Errorf("group snapshot %s: member snapshot %q of %s is not the one its name derives", id, m.SnapshotID, m.VolumeID)
		}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkObject checks what volumes and snapshots share: the recorded ID is
// the record's (id), the name is valid and derives it (derived), and the
// size is positive and rounded.
func checkObject(kind, recorded, id, derived, name string, size int64) error {
	if recorded != id {
		return fmt.Errorf("%s %s: recorded as %q", kind, id, recorded)
	}
	if err := blockdev.CheckName(name); err != nil {
		return fmt.Errorf("%s %s: %w", kind, id, err)
	}
	if derived != id {
		return fmt.Errorf("%s %s: name %q derives %s", kind, id, name, derived)
	}
	if size <= 0 || size%blockdev.SizeAlign != 0 {
		return fmt.Errorf("%s %s: size %d is not a positive multiple of %d", kind, id, size, blockdev.SizeAlign)
	}
	return nil
}

// Quarantined returns the paths of the records set aside (or unreadable)
// when the Store opened, sorted. Each object stays out of service, its data
// file kept, until an operator restores or removes the record and the
// plugin restarts.
func (s *Store) Quarantined() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.quarantined))
	for _, p := range s.quarantined {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// QuarantineCause says why the record at path (as Quarantined lists it)
// was set aside, or nil when an earlier start set it aside.
func (s *Store) QuarantineCause(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quarantineCauses[path]
}

var _ blockdev.Quarantiner = (*Store)(nil)

// checkQuarantined fails with ErrConflict when id's record is quarantined:
// a new object would take over the data file of one that may still exist.
func (s *Store) checkQuarantined(id string) error {
	s.mu.Lock()
	p, ok := s.quarantined[id]
	s.mu.Unlock()
	if ok {
		return fmt.Errorf("%s: its record is unreadable (set aside as %s) and its data file kept; restore or remove them first: %w", id, p, blockdev.ErrConflict)
	}
	return nil
}

// removeObject removes an object's record, then its data file, so that a
// crash in between leaves a data file without a record, which the next
// Open removes.
func (s *Store) removeObject(id string) error {
	if err := atomicfile.Remove(s.metaPath(id)); err != nil {
		return err
	}
	return atomicfile.Remove(s.dataFile(id))
}

// removeOrphans removes, in volumes/ and snapshots/, stale temp files and
// data files whose ID has neither a ready record nor a quarantined one.
func (s *Store) removeOrphans(recs map[string]record) error {
	for _, sub := range []string{"volumes", "snapshots"} {
		dir := filepath.Join(s.cfg.Dir, sub)
		if err := atomicfile.RemoveStale(dir); err != nil {
			return err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read %s: %w", dir, err)
		}
		for _, e := range ents {
			id, ok := strings.CutSuffix(e.Name(), imgSuffix)
			_, known := recs[id]
			_, held := s.quarantined[id]
			if ok && blockdev.ValidID(id) && !known && !held {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
					return fmt.Errorf("remove orphan: %w", err)
				}
			}
		}
		if err := atomicfile.SyncDir(dir); err != nil {
			return err
		}
	}
	return nil
}
