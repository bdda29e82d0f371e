package blockdev

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// Metadata is one JSON file per object, meta/<id>.json, holding a record.
// Files are replaced atomically: write a temp file (tempPrefix*) in meta/,
// fsync it, rename it over the record, fsync meta/. A reader therefore sees
// either the old or the new record, never a torn one, and a record that
// exists after a crash was acknowledged. Leftover temp files are removed
// when the Store opens.
const (
	tempPrefix = atomicfile.TempPrefix
	metaSuffix = ".json"
	imgSuffix  = ".img"

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

func (s *Store) metaPath(id string) string { return filepath.Join(s.cfg.Dir, "meta", id+metaSuffix) }

func (s *Store) writeRecord(id string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", id, err)
	}
	return atomicfile.WriteFile(s.metaPath(id), append(data, '\n'))
}

// readRecords loads every record in meta/, removing temp files and
// half-made records (with their data files). It returns ready records by ID.
func (s *Store) readRecords() (map[string]record, error) {
	dir := filepath.Join(s.cfg.Dir, "meta")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	recs := make(map[string]record)
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("remove temp file: %w", err)
			}
			continue
		}
		id, ok := strings.CutSuffix(name, metaSuffix)
		if !ok || !ValidID(id) {
			continue // not ours: leave it alone
		}
		r, err := s.readRecord(id)
		if err != nil {
			return nil, err
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

func (s *Store) readRecord(id string) (record, error) {
	var r record
	data, err := os.ReadFile(s.metaPath(id))
	if err != nil {
		return r, fmt.Errorf("read record %s: %w", id, err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("decode record %s: %w", s.metaPath(id), err)
	}
	switch {
	case isVolumeID(id) && r.Volume != nil && r.Volume.ID == id && r.Snapshot == nil:
	case isSnapshotID(id) && r.Snapshot != nil && r.Snapshot.ID == id && r.Volume == nil:
	default:
		return r, fmt.Errorf("record %s does not describe %s: %w", s.metaPath(id), id, ErrInvalid)
	}
	return r, nil
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

// removeOrphans removes, in volumes/ and snapshots/, temp files and data
// files whose ID has no ready record.
func (s *Store) removeOrphans(recs map[string]record) error {
	for _, sub := range []string{"volumes", "snapshots"} {
		dir := filepath.Join(s.cfg.Dir, sub)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read %s: %w", dir, err)
		}
		for _, e := range ents {
			name := e.Name()
			id, ok := strings.CutSuffix(name, imgSuffix)
			_, known := recs[id]
			orphan := ok && ValidID(id) && !known
			if orphan || strings.HasPrefix(name, tempPrefix) {
				if err := os.Remove(filepath.Join(dir, name)); err != nil {
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
