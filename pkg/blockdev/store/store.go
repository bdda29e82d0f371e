package store

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/owner"
)

// Config configures a Store.
type Config struct {
	// Dir is the data directory (volumes/, snapshots/, meta/ live below it).
	Dir string
	// OverProvisionRatio scales the free space GetCapacity reports for
	// sparse volumes (1.0 = no over-provisioning). Zero means 1; values
	// below 1 are invalid.
	OverProvisionRatio float64
	// ReserveBytes of the data directory's free space are never handed
	// out: Capacity subtracts them before anything else, so creates,
	// clones, snapshots and expansions stop short of them (and of the
	// kubelet's disk-pressure threshold when the directory shares the
	// root filesystem). Negative values are invalid.
	ReserveBytes int64
	// ReserveRatio reserves this fraction of the filesystem's size
	// instead (0 <= ratio < 1), for nodes whose disks differ in size; it
	// adds to ReserveBytes.
	ReserveRatio float64
}

// VolumeSpec describes a volume to create.
type VolumeSpec struct {
	Name      string
	SizeBytes int64
	Params    map[string]string
	// MutableParams start Volume.MutableParams; they are not part of the
	// volume's identity (ModifyVolume changes them).
	MutableParams map[string]string
	// At most one of these is set.
	SourceSnapshotID string
	SourceVolumeID   string
	// SourceNode is the tag of the node the source lives on when it is
	// not this one: the volume is made with BeginImport, not
	// CreateVolume, and filled from there.
	SourceNode string
	// Hold holds a source volume that is in use steady while it is
	// cloned (nil when it is not in use). It is not persisted.
	Hold Hold
	// Preallocation gives the volume's file disk blocks for all of its
	// size at create (a clone or restore too, its holes filled) and at
	// every expansion, so that the space cannot be taken by others, and
	// with PreallocFull written ones, so that first writes are
	// overwrites (see filecopy.Allocate). Recorded with the volume; part
	// of its identity.
	Preallocation blockdev.Preallocation
}

// Hold holds a volume in use steady while the Store copies its file: when
// it returns, no write reaches the file until release is called. The
// driver builds it from package quiesce (a frozen filesystem, a device
// whose I/O the backend holds, or a flushed device copied by one reflink).
// A nil Hold means the volume is not in use.
type Hold func(ctx context.Context) (release func() error, err error)

// Store keeps volumes and snapshots under one data directory:
//
//	<dir>/volumes/<id>.img    sparse volume files
//	<dir>/snapshots/<id>.img  snapshot files (reflinks or sparse copies)
//	<dir>/meta/<id>.json      one record per object (and group snapshot), replaced atomically
//	<dir>/changes/<id>.json   changed-block records (changes.go)
//	<dir>/lock                flocked by the process serving the directory
//	<dir>/owner               the owner token its devices carry (package owner)
//
// and, kept by others: <dir>/frozen/ (package quiesce), <dir>/ublk/ (the
// ublk backend's device records), <dir>/loop-marked (the loop backend).
//
// The records are the truth: an object exists once its record is durable and
// stops existing when its record is removed. A data file without a record,
// or a record that is not "ready", is a half-made object; Open removes
// both, so a crash at any point loses nothing acknowledged and leaves nothing
// half-made visible.
//
// Store is safe for concurrent use. mu guards only the maps; operations on
// one ID are serialised by a per-ID guard (busy) that is never held under mu,
// so a long copy blocks nothing but the objects it touches.
type Store struct {
	cfg Config

	capMu     sync.Mutex // serialises capacity check-and-reserve; taken before mu
	mu        sync.Mutex
	volumes   map[string]blockdev.Volume
	snapshots map[string]blockdev.Snapshot
	groups    map[string]blockdev.GroupSnapshot
	busy      map[string]chan struct{} // closed when the ID's operation ends
	reserved  map[string]int64         // bytes promised to creates in flight
	// quarantined maps the IDs whose record could not be loaded to the
	// record's path (set aside or in place); filled by Open only.
	quarantined map[string]string
	// quarantineCauses maps a quarantined record's path to why it was
	// set aside (this start's reading of it; none for one an earlier
	// start set aside).
	quarantineCauses map[string]error

	unlock    func() // gives back the data directory's lock
	closeOnce sync.Once
}

// Open opens (creating if needed) the data directory and loads metadata,
// removing stale temp files and half-made objects left by a crash, and
// setting aside records that do not decode (see Quarantined).
//
// The data directory is locked for the Store's life (flock on <dir>/lock):
// a directory another process has open fails with ErrBusy, since two
// plugins would sweep each other's files and devices. Stores opened again
// in the same process share the lock. The owner file (see owner.Ensure) is
// created on first open.
func Open(cfg Config) (*Store, error) {
	if cfg.OverProvisionRatio == 0 {
		cfg.OverProvisionRatio = 1
	}
	if !(cfg.OverProvisionRatio >= 1) {
		return nil, fmt.Errorf("open store: over-provisioning ratio %v below 1: %w", cfg.OverProvisionRatio, blockdev.ErrInvalid)
	}
	if cfg.ReserveBytes < 0 {
		return nil, fmt.Errorf("open store: reserve %d bytes is negative: %w", cfg.ReserveBytes, blockdev.ErrInvalid)
	}
	if !(cfg.ReserveRatio >= 0 && cfg.ReserveRatio < 1) {
		return nil, fmt.Errorf("open store: reserve ratio %v outside [0, 1): %w", cfg.ReserveRatio, blockdev.ErrInvalid)
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("open store: no data directory: %w", blockdev.ErrInvalid)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", cfg.Dir, err)
	}
	cfg.Dir = dir
	for _, sub := range []string{"", "volumes", "snapshots", "meta", changesDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err // names the directory and its holder
	}
	s := &Store{
		cfg:              cfg,
		volumes:          make(map[string]blockdev.Volume),
		snapshots:        make(map[string]blockdev.Snapshot),
		groups:           make(map[string]blockdev.GroupSnapshot),
		busy:             make(map[string]chan struct{}),
		reserved:         make(map[string]int64),
		quarantined:      make(map[string]string),
		quarantineCauses: make(map[string]error),
		unlock:           unlock,
	}
	if err := s.load(); err != nil {
		unlock()
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	return s, nil
}

// load reads the owner token (creating it) and the records, and removes
// what a crash left half-made.
func (s *Store) load() error {
	if _, err := owner.Ensure(s.cfg.Dir); err != nil {
		return err
	}
	recs, err := s.readRecords()
	if err != nil {
		return err
	}
	if err := s.removeOrphans(recs); err != nil {
		return err
	}
	for id, r := range recs {
		switch {
		case r.Volume != nil:
			s.volumes[id] = *r.Volume
		case r.Snapshot != nil:
			s.snapshots[id] = *r.Snapshot
		default:
			s.groups[id] = *r.Group
		}
	}
	return s.removeStrayChanges()
}

// Close gives back the data directory's lock (when no other Store of this
// process holds it). The plugin never closes its Store: the lock goes with
// the process. Idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(s.unlock)
	return nil
}

// Dir is the absolute data directory.
func (s *Store) Dir() string { return s.cfg.Dir }

// VolumeFile is the path of the volume's backing file, or "" when id is not
// a valid volume ID. The file exists only while the volume does.
func (s *Store) VolumeFile(id string) string {
	if !blockdev.IsVolumeID(id) {
		return ""
	}
	return s.dataFile(id)
}

// dataFile is the data file of a valid ID.
func (s *Store) dataFile(id string) string {
	sub := "volumes"
	if blockdev.IsSnapshotID(id) {
		sub = "snapshots"
	}
	return filepath.Join(s.cfg.Dir, sub, id+imgSuffix)
}

// Volume returns a copy of the volume's record or ErrNotFound (also for IDs
// that are not valid volume IDs).
func (s *Store) Volume(id string) (blockdev.Volume, error) {
	s.mu.Lock()
	v, ok := s.volumes[id]
	s.mu.Unlock()
	if !ok {
		return blockdev.Volume{}, fmt.Errorf("volume %q: %w", id, blockdev.ErrNotFound)
	}
	return copyVolume(v), nil
}

// Volumes returns copies of every volume, sorted by ID.
func (s *Store) Volumes() []blockdev.Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]blockdev.Volume, 0, len(s.volumes))
	for _, id := range slices.Sorted(maps.Keys(s.volumes)) {
		out = append(out, copyVolume(s.volumes[id]))
	}
	return out
}

// Snapshot returns a copy of the snapshot's record or ErrNotFound (also for
// IDs that are not valid snapshot IDs).
func (s *Store) Snapshot(id string) (blockdev.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.snapshots[id]
	if !ok {
		return blockdev.Snapshot{}, fmt.Errorf("snapshot %q: %w", id, blockdev.ErrNotFound)
	}
	return snap, nil
}

// Snapshots returns copies of every snapshot, sorted by ID.
func (s *Store) Snapshots() []blockdev.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]blockdev.Snapshot, 0, len(s.snapshots))
	for _, id := range slices.Sorted(maps.Keys(s.snapshots)) {
		out = append(out, s.snapshots[id])
	}
	return out
}

func copyVolume(v blockdev.Volume) blockdev.Volume {
	v.Params = maps.Clone(v.Params)
	v.MutableParams = maps.Clone(v.MutableParams)
	v.Node.Targets = maps.Clone(v.Node.Targets)
	return v
}

// acquire takes the per-ID guards for ids (in sorted order, so that two
// operations never wait on each other), waiting for operations in flight.
func (s *Store) acquire(ctx context.Context, ids ...string) (release func(), err error) {
	ids = slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(ids))), func(id string) bool { return id == "" })
	var held []func()
	releaseAll := func() {
		for _, r := range slices.Backward(held) {
			r()
		}
	}
	for _, id := range ids {
		r, err := s.acquireOne(ctx, id)
		if err != nil {
			releaseAll()
			return nil, err
		}
		held = append(held, r)
	}
	return releaseAll, nil
}

func (s *Store) acquireOne(ctx context.Context, id string) (func(), error) {
	for {
		s.mu.Lock()
		wait, busy := s.busy[id]
		if !busy {
			done := make(chan struct{})
			s.busy[id] = done
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.busy, id)
				s.mu.Unlock()
				close(done)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %s: %w: %w", id, blockdev.ErrBusy, ctx.Err())
		}
	}
}

// CanReflink reports whether the data directory's filesystem shares extents
// between files (see filecopy.CanReflink): a copy of a volume is then one
// reflink, made at a single point in time.
func (s *Store) CanReflink() (bool, error) {
	return filecopy.CanReflink(filepath.Join(s.cfg.Dir, "volumes"))
}
