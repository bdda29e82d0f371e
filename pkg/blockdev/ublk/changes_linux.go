// The change records of the devices a Server serves (package cbt).

package ublk

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// Changes is a cut of a device's change record: the ranges of the volume
// its writes, discards and write-zeroes changed (normalized; an extent
// may run past the device's end, up to math.MaxInt64, after the device
// grew), and whether they are all that changed since the volume's last
// snapshot.
type Changes struct {
	Extents []cbt.Extent
	Trusted bool
}

// Handover is a device's change record as a process that stopped serving
// it left it in its state file (State.Handover), for the next process to
// carry on, stamped with the backing file's inode and change time (ctime,
// nanoseconds) once the device's last write was in the file. Every write
// moves a file's change time on, whichever process makes it: a record
// whose stamp no longer matches its file misses writes and is not trusted
// (a process that took it over but could not remove it from the state
// file, and wrote, voids it so).
type Handover struct {
	Changes
	Inode uint64 `json:"inode"`
	Ctime int64  `json:"ctimeNs"`
}

// stamp returns the inode and change time of the open file f.
func stamp(f *os.File) (ino uint64, ctime int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return st.Ino, st.Ctim.Nano(), nil
}

// matches reports whether f is the file h was made of, unchanged since.
func (h *Handover) matches(f *os.File) bool {
	ino, ctime, err := stamp(f)
	return err == nil && h.Inode != 0 && ino == h.Inode && ctime == h.Ctime
}

// CutChanges returns the record of the volume's device since its attach or
// its last cut, and starts a new one, trusted from then on. The device's
// I/O must be held (Pause), so that the cut falls between the writes a
// snapshot holds and those it does not: a write recorded before the cut
// and still in flight could reach the file after the snapshot's copy. A
// device whose I/O is not held gives an error wrapping os.ErrInvalid; a
// volume the server does not serve, or serves untracked (or whose record
// it handed over), one wrapping os.ErrNotExist.
func (s *Server) CutChanges(id string) (Changes, error) {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || sv.changes == nil {
		return Changes{}, fmt.Errorf("cut changes of %s: %w", id, os.ErrNotExist)
	}
	if !sv.dev.gate.Held() {
		return Changes{}, fmt.Errorf("cut changes of %s: the device's i/o is not held: %w", id, errInvalid)
	}
	exts, trusted := sv.changes.Cut()
	return Changes{Extents: exts, Trusted: trusted}, nil
}

// PutBackChanges returns a cut to the volume's record when what it was for
// failed (cbt.Tracker.PutBack). A volume no longer served, or whose record
// was handed over since, gives an error wrapping os.ErrNotExist: the cut
// is then in no record of this server, and the caller must keep it.
func (s *Server) PutBackChanges(id string, ch Changes) error {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || sv.changes == nil {
		return fmt.Errorf("put back changes of %s: %w", id, os.ErrNotExist)
	}
	sv.changes.PutBack(ch.Extents, ch.Trusted)
	return nil
}

// HandOver hands the change record of the volume's device to the next
// process as the plugin stops without releasing its devices (a rollout):
// it holds the device's I/O (Pause) and leaves it held, then records the
// device's change record in its state file (handOver). The process then
// ends as a crash would, its rings closed by the exit; the kernel requeues
// the requests held in the server (USER_RECOVERY_REISSUE), and the next
// process re-adopts the device, carries the record on (adoptOne) and
// serves them. After it the device's record is gone from this server: its
// cuts fail. A volume not served, or served untracked, has nothing to hand
// over.
func (s *Server) HandOver(ctx context.Context, id string) error {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || sv.changes == nil {
		return nil
	}
	if _, err := sv.dev.Pause(ctx); err != nil {
		return fmt.Errorf("hand over the change record of %s: %w", id, err)
	}
	return s.handOver(sv)
}

// handOver records the change record of a device whose writes have all
// reached its file and none may follow (its I/O held, or its server
// threads ended) in its state file (State.Handover), with the file's
// stamp, for the next process's re-adoption, and takes it from sv.
func (s *Server) handOver(sv *served) error {
	if sv.changes == nil || sv.file == nil {
		return nil
	}
	exts, trusted := sv.changes.Cut()
	sv.changes = nil
	ino, ctime, err := stamp(sv.file)
	if err != nil {
		return fmt.Errorf("hand over the change record of %s: %w", sv.st.VolumeID, err)
	}
	st := sv.st
	st.Handover = &Handover{Changes: Changes{Extents: exts, Trusted: trusted}, Inode: ino, Ctime: ctime}
	if err := saveState(s.cfg.StateDir, st); err != nil {
		return fmt.Errorf("hand over the change record of %s: %w", st.VolumeID, err)
	}
	return nil
}

// takeHandover returns the tracker a re-adopted device starts with: the
// record an earlier process handed over in st, if it was made of file as
// it is (Handover.matches) and could be removed from the state file first
// (durably), so that a crash after the device serves again never finds
// it; an empty, untrusted one otherwise. It returns st without the
// hand-over.
func (s *Server) takeHandover(st State, file *os.File) (*cbt.Tracker, State, error) {
	h := st.Handover
	st.Handover = nil
	var carry []cbt.Extent
	trusted := false
	if h != nil && saveState(s.cfg.StateDir, st) == nil && h.matches(file) {
		carry, trusted = h.Extents, h.Trusted
	}
	if !s.cfg.Thread.Ablation.TracksChanges() {
		return nil, st, nil
	}
	tr, err := cbt.NewTracker(st.SizeBytes, st.Tuning.Queues, carry, trusted)
	return tr, st, err
}
