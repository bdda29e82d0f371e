package ublk

import (
	"errors"
	"fmt"
	"sort"
)

// ErrNoThread is the class of Health's failure when no server thread is
// left to serve a new device.
var ErrNoThread = errors.New("no live server thread")

// Health reports why the server does not serve every device it holds: a
// device whose queue or server thread failed has its I/O held by the
// kernel, so its users hang until it is recovered. It lists every such
// volume with its failure (Device.Err), and fails too when no server thread
// is left for new devices. Nil when all is served.
func (s *Server) Health() error {
	s.mu.Lock()
	ids := make([]string, 0, len(s.devs))
	for id := range s.devs {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	sort.Strings(ids)
	var errs []error
	for _, id := range ids {
		if sv := s.get(id); sv != nil {
			if err := sv.dev.Err(); err != nil {
				errs = append(errs, fmt.Errorf("volume %s holds its i/o: %w", id, err))
			}
		}
	}
	if s.threads != nil && s.threads.live() == 0 {
		errs = append(errs, fmt.Errorf("all %d server threads failed: %w", s.threads.Len(), ErrNoThread))
	}
	return errors.Join(errs...)
}
