package ublk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// ErrNoThread is the class of Health's failure when no server thread is
// left to serve a new device.
var ErrNoThread = errors.New("no live server thread")

// Health reports why the server does not serve every device it holds: a
// device whose queue or server thread failed, or whose re-adoption could
// neither finish nor be undone, has its I/O held by the kernel, so its
// users hang until it is recovered. The devices of a failed server thread
// do not fail it while their re-adoption in the process (healVolume) is
// under way, retries included, and fail it for good where that gave up. It lists every such volume with its
// failure, and fails too when no server thread is left for new devices.
// Nil when all is served.
func (s *Server) Health() error {
	s.mu.Lock()
	ids := make([]string, 0, len(s.devs))
	for id := range s.devs {
		ids = append(ids, id)
	}
	gaveUp := maps.Clone(s.gaveUp)
	var errs []error
	for id, st := range s.stuck {
		errs = append(errs, fmt.Errorf("volume %s holds its i/o until the plugin restarts: %w", id, st.err))
	}
	s.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		if sv := s.get(id); sv != nil {
			if err := sv.dev.Err(); err != nil {
				why, gave := gaveUp[id]
				if errors.Is(err, dataplane.ErrThreadDead) && !gave {
					continue // being healed (healVolume)
				}
				if gave {
					// Why it was not re-adopted: for a device
					// still LIVE, that it needs a reboot.
					err = fmt.Errorf("%w; not re-adopted: %w", err, why)
				}
				errs = append(errs, fmt.Errorf("volume %s holds its i/o: %w", id, err))
			}
		}
	}
	// A shared pool with no live thread serves nothing; a per-device pool
	// under its bound starts a thread for the next device, and its failed
	// threads' devices are being healed (above).
	if p := s.Threads(); p != nil && p.Len() > 0 && p.Live() == 0 && !p.CanStart() {
		errs = append(errs, fmt.Errorf("all %d server threads failed: %w", p.Len(), ErrNoThread))
	}
	return errors.Join(errs...)
}

// stuck is a device whose re-adoption failed after its queues started on
// the shared threads, which could not end them: its /dev/ublkcN and backing
// file stay open while they run.
type stuck struct {
	dev  *Device
	file *os.File
	err  error
}

// release closes the stuck device's files once its queues have ended.
func (st *stuck) release() error {
	var errs []error
	if st.dev != nil {
		if err := st.dev.waitQueues(context.Background()); err != nil {
			return err // still running: left open
		}
		errs = append(errs, st.dev.closeChar())
	}
	if st.file != nil {
		errs = append(errs, st.file.Close())
	}
	return errors.Join(errs...)
}

// hold records a device the server can neither serve nor let go of.
func (s *Server) hold(id string, st *stuck) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stuck == nil {
		s.stuck = map[string]*stuck{}
	}
	s.stuck[id] = st
}

// unhold releases a stuck device whose queues its removal ended.
func (s *Server) unhold(id string) {
	s.mu.Lock()
	st := s.stuck[id]
	delete(s.stuck, id)
	s.mu.Unlock()
	if st != nil {
		_ = st.release()
	}
}
