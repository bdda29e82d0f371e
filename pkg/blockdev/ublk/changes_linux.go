// The change records of the devices a Server serves (package cbt).

package ublk

import (
	"fmt"
	"os"

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

// CutChanges returns the record of the volume's device since its attach or
// its last cut, and starts a new one, trusted from then on. The caller
// holds the device's I/O (Pause) or its filesystem frozen, so that the cut
// falls between the writes a snapshot holds and those it does not. A
// volume the server does not serve, or serves untracked, gives an error
// wrapping os.ErrNotExist.
func (s *Server) CutChanges(id string) (Changes, error) {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || sv.changes == nil {
		return Changes{}, fmt.Errorf("cut changes of %s: %w", id, os.ErrNotExist)
	}
	exts, trusted := sv.changes.Cut()
	return Changes{Extents: exts, Trusted: trusted}, nil
}

// PutBackChanges returns a cut to the volume's record when what it was for
// failed (cbt.Tracker.PutBack). A volume no longer served gives an error
// wrapping os.ErrNotExist: its record is gone with its device, and the
// caller must treat the volume's changes as unknown.
func (s *Server) PutBackChanges(id string, ch Changes) error {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || sv.changes == nil {
		return fmt.Errorf("put back changes of %s: %w", id, os.ErrNotExist)
	}
	sv.changes.PutBack(ch.Extents, ch.Trusted)
	return nil
}

// handOver records the change record of a device Close released in its
// state file (State.Handover), for the next process's re-adoption. The
// caller has ended every server thread, so no mark is still to come.
func (s *Server) handOver(sv *served) error {
	if sv.changes == nil {
		return nil
	}
	exts, trusted := sv.changes.Cut()
	st := sv.st
	st.Handover = &Changes{Extents: exts, Trusted: trusted}
	if err := saveState(s.cfg.StateDir, st); err != nil {
		return fmt.Errorf("hand over the change record of %s: %w", st.VolumeID, err)
	}
	return nil
}

// takeHandover returns the tracker a re-adopted device starts with: the
// record an earlier process's Close handed over in st, removed from the
// state file first (durably), so that a crash after the device serves
// again never finds it; an empty, untrusted one when there is none or it
// cannot be removed. It returns st without the hand-over.
func (s *Server) takeHandover(st State) (*cbt.Tracker, State, error) {
	h := st.Handover
	st.Handover = nil
	var carry []cbt.Extent
	trusted := false
	if h != nil && saveState(s.cfg.StateDir, st) == nil {
		carry, trusted = h.Extents, h.Trusted
	}
	if !s.cfg.Thread.Ablation.TracksChanges() {
		return nil, st, nil
	}
	tr, err := cbt.NewTracker(st.SizeBytes, st.Tuning.Queues, carry, trusted)
	return tr, st, err
}
