package ublk

import (
	"slices"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// watchAll watches every thread of the pool for a failure.
func (s *Server) watchAll() {
	if p := s.Threads(); p != nil {
		p.Watch(s.watch)
	}
}

// watch reports the failure of t (not its close) the moment it happens,
// with the volumes it served, and heals it (healThread): their devices hold
// their I/O, and Health fails, until they are re-adopted in the process,
// or, where that fails, by the restarted plugin.
func (s *Server) watch(t *dataplane.Thread) {
	<-t.Done()
	err := t.Err()
	if err == nil || !s.beginHeal() {
		return
	}
	defer s.heals.Done()
	s.report(err, "ublk server thread failed: its devices hold their i/o until they are re-adopted in the process (health fails meanwhile)",
		"thread", t.ID(), "volumes", s.volumesOf(t))
	s.healThread(s.healCtx, t)
}

// volumesOf lists the volumes with a queue on t.
func (s *Server) volumesOf(t *dataplane.Thread) []string {
	var out []string
	for _, d := range s.List() {
		if sv := s.get(d.VolumeID); sv != nil && slices.ContainsFunc(sv.dev.queues, func(q *dataplane.Queue) bool { return q.Thread() == t }) {
			out = append(out, d.VolumeID)
		}
	}
	return out
}

// report passes a background event to ServerConfig.Report, if set.
func (s *Server) report(err error, msg string, keysAndValues ...any) {
	if s.cfg.Report != nil {
		s.cfg.Report(err, msg, keysAndValues...)
	}
}
