package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// A volume whose source is on another node (VolumeSpec.SourceNode) is
// made in two steps, with its data written in between by whoever brings
// it (the driver, from the source's node):
//
//	imp, err := s.BeginImport(ctx, spec) // record "creating", empty file
//	... write into imp.File() ...
//	v, err := imp.Commit()               // fsync, record "ready"
//
// or imp.Abort(), which removes both. Until Commit the volume does not
// exist for anyone (Volume, Volumes, a create of its name waits for the
// guard); a crash leaves a "creating" record, which Open removes with the
// file. The guard of the volume's ID is held from BeginImport to Commit or
// Abort.

// Import is a volume being filled with data from elsewhere.
type Import struct {
	s       *Store
	v       blockdev.Volume
	f       *os.File
	release func()
	done    bool
}

// BeginImport starts the volume spec describes, whose source
// (SourceSnapshotID or SourceVolumeID) lives on the node spec.SourceNode
// names, with spec.SizeBytes (which must hold the source). An existing
// volume of the name is returned with a nil Import, and ErrConflict when
// it does not match spec (as CreateVolume answers).
func (s *Store) BeginImport(ctx context.Context, spec VolumeSpec) (blockdev.Volume, *Import, error) {
	if spec.SourceNode == "" {
		return blockdev.Volume{}, nil, fmt.Errorf("volume %q: import without a source node: %w", spec.Name, blockdev.ErrInvalid)
	}
	size, _, err := checkSpec(spec)
	if err != nil {
		return blockdev.Volume{}, nil, err
	}
	id := blockdev.VolumeID(spec.Name)
	release, err := s.acquire(ctx, id)
	if err != nil {
		return blockdev.Volume{}, nil, err
	}
	if v, err := s.Volume(id); err == nil {
		release()
		return v, nil, sameVolume(v, spec, size)
	}
	imp, err := s.beginImport(id, spec, size)
	if err != nil {
		release()
		return blockdev.Volume{}, nil, err
	}
	imp.release = release
	return imp.v, imp, nil
}

func (s *Store) beginImport(id string, spec VolumeSpec, size int64) (*Import, error) {
	if err := s.checkQuarantined(id); err != nil {
		return nil, fmt.Errorf("volume %q: %w", spec.Name, err)
	}
	if err := s.reserve(id, size, spec.Preallocation != blockdev.PreallocOff); err != nil {
		return nil, err
	}
	v := blockdev.Volume{
		ID: id, Name: spec.Name, SizeBytes: size, Params: maps.Clone(spec.Params), MutableParams: maps.Clone(spec.MutableParams),
		SourceSnapshotID: spec.SourceSnapshotID, SourceVolumeID: spec.SourceVolumeID, SourceNode: spec.SourceNode,
		CreatedAt: time.Now().UTC(), Preallocation: spec.Preallocation,
	}
	imp := &Import{s: s, v: v}
	err := s.writeRecord(id, record{State: stateCreating, Volume: &v})
	if err == nil {
		err = filecopy.MakeFile(context.Background(), s.dataFile(id), "", size)
	}
	if err == nil {
		imp.f, err = os.OpenFile(s.dataFile(id), os.O_WRONLY, 0)
	}
	if err != nil {
		s.removeObject(id)
		s.unreserve(id)
		return nil, classify(fmt.Errorf("begin import %s: %w", id, err))
	}
	return imp, nil
}

// File is the volume's data file, open for writing at offsets.
func (imp *Import) File() *os.File { return imp.f }

// Volume is the volume being made.
func (imp *Import) Volume() blockdev.Volume { return copyVolume(imp.v) }

// Commit makes the data durable, allocates a preallocated volume's holes,
// and records the volume as ready: from then on it exists.
func (imp *Import) Commit() (blockdev.Volume, error) {
	if imp.done {
		return blockdev.Volume{}, fmt.Errorf("import %s: already ended", imp.v.ID)
	}
	s, id := imp.s, imp.v.ID
	err := imp.f.Sync()
	if cerr := imp.f.Close(); err == nil {
		err = cerr
	}
	if err == nil && imp.v.Preallocated() {
		err = filecopy.Allocate(s.dataFile(id), 0, imp.v.SizeBytes, imp.v.Preallocation == blockdev.PreallocFull)
	}
	if err == nil {
		err = s.writeRecord(id, record{State: stateReady, Volume: &imp.v})
	}
	if err != nil {
		imp.abort()
		return blockdev.Volume{}, classify(fmt.Errorf("commit import %s: %w", id, err))
	}
	s.mu.Lock()
	s.volumes[id] = imp.v
	s.mu.Unlock()
	imp.end()
	return copyVolume(imp.v), nil
}

// Abort removes what the import made. Idempotent; a no-op after Commit.
func (imp *Import) Abort() error {
	if imp.done {
		return nil
	}
	return imp.abort()
}

func (imp *Import) abort() error {
	imp.f.Close()
	err := imp.s.removeObject(imp.v.ID)
	imp.end()
	return err
}

func (imp *Import) end() {
	imp.done = true
	imp.s.unreserve(imp.v.ID)
	imp.release()
}

// OpenSnapshot opens the snapshot's data file for reading and returns its
// size. The open file keeps the data while it is read, whatever happens to
// the snapshot meanwhile.
func (s *Store) OpenSnapshot(ctx context.Context, id string) (*os.File, int64, error) {
	var f *os.File
	var size int64
	err := s.withSnapshot(ctx, id, func(snap blockdev.Snapshot) error {
		var err error
		if f, err = os.Open(s.dataFile(id)); err != nil {
			return fmt.Errorf("open snapshot %s: %w", id, err)
		}
		size = snap.SizeBytes
		return nil
	})
	return f, size, err
}

// withSnapshot runs fn with the snapshot's record while the snapshot is
// held (not deleted meanwhile). An ID that is no snapshot's is
// ErrNotFound.
func (s *Store) withSnapshot(ctx context.Context, id string, fn func(blockdev.Snapshot) error) error {
	if !blockdev.IsSnapshotID(id) {
		return fmt.Errorf("snapshot %q: %w", id, blockdev.ErrNotFound)
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	snap, err := s.Snapshot(id)
	if err != nil {
		return err
	}
	return fn(snap)
}

// CopyVolume takes a point-in-time copy of the volume, as consistent as
// a snapshot of it with the same hold (see CreateSnapshot), and returns
// it open for reading, already unlinked: it takes space only while it is
// open. A crash while it is made leaves a temp file in snapshots/, which
// Open removes. The volume is never written.
func (s *Store) CopyVolume(ctx context.Context, id string, hold Hold) (*os.File, int64, error) {
	if !blockdev.IsVolumeID(id) {
		return nil, 0, fmt.Errorf("volume %q: %w", id, blockdev.ErrNotFound)
	}
	release, err := s.acquire(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer release()
	v, err := s.Volume(id)
	if err != nil {
		return nil, 0, err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(s.cfg.Dir, "snapshots", tempPrefix+"copy-"+id+"-"+hex.EncodeToString(rnd[:]))
	key := "copy/" + tmp
	if err := s.reserveCopy(key, s.dataFile(id)); err != nil {
		return nil, 0, fmt.Errorf("copy volume %s: %w", id, err)
	}
	defer s.unreserve(key)
	// Not synced: the copy is unlinked below and lives only while it is
	// read; a sync would cost the volume's disk for nothing (fio on the
	// volume saw 0.4-0.8 s without a completed I/O while 512 MiB were
	// synced).
	err = copyHeld(ctx, tmp, s.dataFile(id), v.SizeBytes, hold, false)
	var f *os.File
	if err == nil {
		f, err = os.Open(tmp)
	}
	if rerr := atomicfile.Remove(tmp); err == nil && rerr != nil {
		f.Close()
		err = rerr
	}
	if err != nil {
		return nil, 0, classify(fmt.Errorf("copy volume %s: %w", id, err))
	}
	return f, v.SizeBytes, nil
}

// SameVolume answers a repeated create of an existing volume v as
// CreateVolume does: nil when spec matches v, ErrConflict otherwise. A
// spec without a size (from a source) matches any size.
func SameVolume(v blockdev.Volume, spec VolumeSpec) error {
	var size int64
	if spec.SizeBytes != 0 {
		var err error
		if size, err = blockdev.RoundSize(spec.SizeBytes); err != nil {
			return err
		}
	}
	return sameVolume(v, spec, size)
}
