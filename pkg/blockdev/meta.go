package blockdev

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Metadata is one JSON file per object, meta/<id>.json, holding a record.
// Files are replaced atomically: write a temp file (tempPrefix*) in meta/,
// fsync it, rename it over the record, fsync meta/. A reader therefore sees
// either the old or the new record, never a torn one, and a record that
// exists after a crash was acknowledged. Leftover temp files are removed
// when the Store opens.
const (
	tempPrefix = ".tmp-"
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

// writeFileAtomic replaces path with data durably.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}

// syncDir makes the directory's entries (creations, renames, removals) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// removeDurably removes path (a missing path is fine) and syncs its directory.
func removeDurably(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func (s *Store) metaPath(id string) string { return filepath.Join(s.cfg.Dir, "meta", id+metaSuffix) }

func (s *Store) writeRecord(id string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", id, err)
	}
	return writeFileAtomic(s.metaPath(id), append(data, '\n'))
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
	return recs, syncDir(dir)
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
	if err := removeDurably(s.metaPath(id)); err != nil {
		return err
	}
	return removeDurably(s.dataFile(id))
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
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}
