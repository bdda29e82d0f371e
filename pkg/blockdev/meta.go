package blockdev

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// Metadata is one JSON file per object, meta/<id>.json, holding a record.
// Files are replaced atomically: write a temp file (tempPrefix*) in meta/,
// fsync it, rename it over the record, fsync meta/. A reader therefore sees
// either the old or the new record, never a torn one, and a record that
// exists after a crash was acknowledged. Temp files older than
// atomicfile.StaleAge are removed when the Store opens.
//
// A record that cannot be decoded (a disk or filesystem fault, a hand
// edit) is quarantined: renamed to meta/<id>.json.corrupt-<time>, never
// deleted. The Store serves every other object, reports the set-aside
// files (Quarantined), keeps the object's data file, and refuses to make a
// new object with its ID, until an operator restores or removes the file.
const (
	tempPrefix  = atomicfile.TempPrefix
	metaSuffix  = ".json"
	imgSuffix   = ".img"
	corruptMark = ".corrupt-"

	stateReady = "ready"
)

// record is the on-disk form of one object. State is "ready" for every
// record the Store writes today; any other state marks a half-made object
// that OpenStore removes.
type record struct {
	State    string    `json:"state"`
	Volume   *Volume   `json:"volume,omitempty"`
	Snapshot *Snapshot `json:"snapshot,omitempty"`
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
// do not decode. It returns ready records by ID and fills s.quarantined.
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
	for _, e := range ents {
		name := e.Name()
		if id, _, ok := strings.Cut(name, metaSuffix+corruptMark); ok && ValidID(id) {
			s.quarantined[id] = filepath.Join(dir, name)
			continue
		}
		id, ok := strings.CutSuffix(name, metaSuffix)
		if !ok || !ValidID(id) {
			continue // a temp file, or not ours: leave it alone
		}
		r, err := s.readRecord(id)
		if err != nil {
			if err := s.quarantine(id, err); err != nil {
				return nil, err
			}
			continue
		}
		if r.State != stateReady {
			if err := s.removeObject(id); err != nil {
				return nil, err
			}
			continue
		}
		recs[id] = r
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
	switch {
	case isVolumeID(id) && r.Volume != nil && r.Volume.ID == id && r.Snapshot == nil:
	case isSnapshotID(id) && r.Snapshot != nil && r.Snapshot.ID == id && r.Volume == nil:
	default:
		return r, fmt.Errorf("record %s does not describe %s: %w", s.metaPath(id), id, errCorrupt)
	}
	return r, nil
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

// Quarantiner is implemented by what sets aside records it cannot read
// (the Store, the ublk backend): Quarantined lists their paths. Each needs
// an operator: the object it describes is out of service, its data and
// device kept, until the record is restored or removed.
type Quarantiner interface {
	Quarantined() []string
}

var (
	_ Quarantiner = (*Store)(nil)
	_ Quarantiner = (*ublkBackend)(nil)
)

// checkQuarantined fails with ErrConflict when id's record is quarantined:
// a new object would take over the data file of one that may still exist.
func (s *Store) checkQuarantined(id string) error {
	s.mu.Lock()
	p, ok := s.quarantined[id]
	s.mu.Unlock()
	if ok {
		return fmt.Errorf("%s: its record is unreadable (set aside as %s) and its data file kept; restore or remove them first: %w", id, p, ErrConflict)
	}
	return nil
}

// removeObject removes an object's record, then its data file, so that a
// crash in between leaves a data file without a record, which the next
// OpenStore removes.
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
			if ok && ValidID(id) && !known && !held {
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
