package ublk

import (
	"slices"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// watchAll watches every thread of the pool for a failure.
func (s *Server) watchAll() {
	if p := s.Threads(); p != nil {
		for _, t := range p.Threads() {
			go s.watch(t)
		}
	}
}

// watch reports the failure of t (not its close) the moment it happens,
// with the volumes it served: their devices hold their I/O, and Health
// fails, until a restarted plugin re-adopts them.
func (s *Server) watch(t *dataplane.Thread) {
	<-t.Done()
	err := t.Err()
	if err == nil || s.closed.Load() {
		return
	}
	s.report(err, "ublk server thread failed: its devices hold their i/o until the plugin restarts and re-adopts them (health fails meanwhile)",
		"thread", t.ID(), "volumes", s.volumesOf(t))
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
