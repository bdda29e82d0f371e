// Operations on the devices a Server serves, by volume ID.

package ublk

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// Resize grows the volume's live device (UPDATE_SIZE, 6.16+). Without the
// feature the error wraps errors.ErrUnsupported; an unknown volume
// os.ErrNotExist.
func (s *Server) Resize(ctx context.Context, id string, sizeBytes int64) error {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil {
		return fmt.Errorf("resize %s: %w", id, os.ErrNotExist)
	}
	if sizeBytes == sv.st.SizeBytes {
		return nil
	}
	if err := sv.dev.Resize(sizeBytes); err != nil {
		return err
	}
	st := sv.st
	st.SizeBytes = sizeBytes
	if err := saveState(s.cfg.StateDir, st); err != nil {
		return err
	}
	s.mu.Lock()
	sv.st = st
	s.mu.Unlock()
	return nil
}

// SetLimits puts new rate limits in force on the volume's live device at
// once (requests already held are booked again under them) and records
// them for re-adoption. An unknown volume gives os.ErrNotExist.
func (s *Server) SetLimits(id string, lim qos.Limits) error {
	if err := lim.Validate(); err != nil {
		return fmt.Errorf("set limits of %s: %w: %w", id, err, errInvalid)
	}
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil {
		return fmt.Errorf("set limits of %s: %w", id, os.ErrNotExist)
	}
	if sv.st.Limits == lim {
		return nil
	}
	st := sv.st
	st.Limits = lim
	if err := saveState(s.cfg.StateDir, st); err != nil {
		return err
	}
	sv.lim.Set(lim)
	sv.dev.Nudge()
	s.mu.Lock()
	sv.st = st
	s.mu.Unlock()
	return nil
}

// List returns every served device, sorted by volume ID.
func (s *Server) List() []Served {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Served, 0, len(s.devs))
	for _, sv := range s.devs {
		out = append(out, sv.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out
}

// Pause holds the I/O of the volume's device until resume (Device.Pause),
// so its backing file can be copied or cloned consistently while in use.
func (s *Server) Pause(ctx context.Context, id string) (resume func(), err error) {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil {
		return nil, fmt.Errorf("pause %s: %w", id, os.ErrNotExist)
	}
	open, err := sv.dev.Pause(ctx)
	if err != nil {
		return nil, err
	}
	return func() {
		open()
		// The device re-adopted since (its server thread failed:
		// rehome) holds its requests behind the same gate, on
		// other threads: wake those too.
		if cur := s.get(id); cur != nil {
			cur.dev.Nudge()
		}
	}, nil
}

// Err reports why the volume's device is not fully served (a failed queue
// or server thread), nil when it is, and an error wrapping os.ErrNotExist
// for a volume the server does not serve.
func (s *Server) Err(id string) error {
	sv := s.get(id)
	if sv == nil {
		return fmt.Errorf("ublk device of %s: %w", id, os.ErrNotExist)
	}
	return sv.dev.Err()
}

// Stats returns the sum of the queue counters of a volume's device, those
// of the queues a heal ended included, and how often this process
// re-adopted the device (from an earlier process, or after a server thread
// failed); false for a volume the server does not serve.
func (s *Server) Stats(id string) (total QueueStats, recoveries uint64, ok bool) {
	sv := s.get(id)
	if sv == nil {
		return QueueStats{}, 0, false
	}
	return sv.total(), sv.recoveries, true
}

// total sums the counters of the device's queues and of those it had
// before a heal.
func (sv *served) total() QueueStats {
	t := sv.ended
	for _, q := range sv.dev.Stats() {
		t = t.Add(q)
	}
	return t
}
