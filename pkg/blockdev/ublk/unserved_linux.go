// Devices the server keeps but cannot serve: failing their I/O after a
// bound instead of holding it for ever.

package ublk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// ErrFailingIO is the class of a device whose I/O the server fails: a
// started device carrying its owner token that no readable state names,
// which it therefore cannot re-adopt for any volume (its state file lost,
// the volume's record disagreeing with the kernel: Held), found so for
// ServerConfig.FailUnservedAfter.
var ErrFailingIO = errors.New("its i/o fails with EIO")

// failing is a device the server serves with FailTarget.
type failing struct {
	dev   *Device
	since time.Time
}

// Why not UBLK_F_USER_RECOVERY_FAIL_IO (Linux 6.13+): the kernel chooses
// between holding a device's I/O and failing it by that ADD_DEV flag alone,
// when the device's server exits (ublk_ch_release), for every exit: with
// it, every rollout's restart would fail the volumes' I/O (EIO) instead of
// holding it until the next process re-adopts them, and nothing can set it
// on a device later. So every kernel gets the same: a device that is not
// re-adopted within the bound is re-adopted by this server with queues that
// answer every request with EIO. It stays so until the process ends (on
// kernels without QUIESCE its queues cannot be ended alone), and the next
// process, the record repaired, re-adopts it for its volume.

// watchUnserved fails the I/O of the devices unserved for at least bound:
// it looks at start and then every bound, and a device found unserved by
// two looks in a row, and still so under healMu, is re-adopted with
// FailTarget (failIO): one unserved at start, after bound; one that
// becomes so later, within two. It returns when ctx ends (Close).
func (s *Server) watchUnserved(ctx context.Context, bound time.Duration) {
	defer s.heals.Done()
	seen := map[uint32]bool{}
	tick := time.NewTicker(bound)
	defer tick.Stop()
	for {
		devs, err := s.unserved()
		if err != nil {
			s.report(err, "cannot look for ublk devices this plugin keeps but cannot serve")
		}
		next := map[uint32]bool{}
		for _, info := range devs {
			if seen[info.DevID] {
				s.failIO(ctx, info.DevID)
			} else {
				next[info.DevID] = true
			}
		}
		seen = next
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// unserved returns the started devices carrying the server's owner token
// that no readable state names, other than those it fails already: no
// volume's re-adoption can take them (heal refuses a device it cannot tell
// is the volume's), and their I/O waits.
func (s *Server) unserved() ([]DevInfo, error) {
	scan, err := loadStates(s.cfg.StateDir, false)
	if err != nil {
		return nil, err
	}
	devs, err := s.unrecorded(scan.states)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(devs, func(info DevInfo) bool {
		_, f := s.failing[info.DevID]
		return f || (info.State != StateLive && info.State != StateQuiesced && info.State != StateFailIO)
	}), nil
}

// failIO re-adopts device id, if it is still unserved, with queues that
// fail every request (FailTarget), and reports it.
func (s *Server) failIO(ctx context.Context, id uint32) {
	s.healMu.Lock() // a heal re-adopting it for its volume goes first
	defer s.healMu.Unlock()
	devs, err := s.unserved()
	if err != nil || !slices.ContainsFunc(devs, func(info DevInfo) bool { return info.DevID == id }) {
		return
	}
	dev, err := RecoverDevice(ctx, s.ctl, id, DeviceConfig{Target: FailTarget(), Owner: s.owner, Queue: s.cfg.Queue, Threads: s.threads})
	if err != nil {
		s.report(err, "a ublk device this plugin cannot re-adopt holds its i/o, and failing it failed too", "device", blockPath(id))
		if dev != nil {
			// Its queues run on the shared threads: kept until they
			// end, and Health fails meanwhile (a restart ends them).
			s.hold(blockPath(id), &stuck{dev: dev, err: err})
		}
		return
	}
	s.mu.Lock()
	if s.failing == nil {
		s.failing = map[uint32]*failing{}
	}
	s.failing[id] = &failing{dev: dev, since: time.Now()}
	s.mu.Unlock()
	s.report(fmt.Errorf("ublk device %s: %w", blockPath(id), ErrFailingIO),
		"a ublk device this plugin keeps but cannot re-adopt (no readable record names it) now fails every request with EIO instead of holding it; "+
			"to serve it again, restore its volume's record (the device link or the state file) and restart the plugin",
		"device", blockPath(id), "after", s.cfg.FailUnservedAfter)
}

// FailingIO returns, by block device, since when the server fails the I/O
// of the devices it cannot re-adopt.
func (s *Server) FailingIO() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]time.Time, len(s.failing))
	for id, f := range s.failing {
		out[blockPath(id)] = f.since
	}
	return out
}

// failingNote says which devices fail their I/O, for Held's reasons: the
// server cannot tell which device is a held volume's, so each names them
// all; "" when none does.
func (s *Server) failingNote() string {
	var devs []string
	for dev, since := range s.FailingIO() {
		devs = append(devs, fmt.Sprintf("%s since %s", dev, since.UTC().Format(time.RFC3339)))
	}
	if len(devs) == 0 {
		return ""
	}
	sort.Strings(devs)
	return strings.Join(devs, ", ")
}

// closeFailing ends the failing devices' service with the threads' end
// (Close): their files close, and the devices stay, quiesced, for the
// next process.
func (s *Server) closeFailing() []error {
	s.mu.Lock()
	devs := maps.Clone(s.failing)
	s.failing = nil
	s.mu.Unlock()
	var errs []error
	for _, f := range devs {
		if err := f.dev.waitQueues(context.Background()); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, f.dev.closeChar())
	}
	return errs
}

// failingDevice reports whether the server fails device id's I/O.
func (s *Server) failingDevice(id uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.failing[id]
	return ok
}
