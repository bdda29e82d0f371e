// Attaching a volume: a new device, or the re-adoption of a recorded one
// (adoptRecorded, in server_linux.go).

package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// Attach returns the volume's device, creating it if needed. An existing
// device for the same file is returned as is; one for another file is an
// error wrapping os.ErrExist.
func (s *Server) Attach(ctx context.Context, spec AttachSpec) (Served, error) {
	if err := validName(spec.VolumeID); err != nil {
		return Served{}, err
	}
	if err := spec.Limits.Validate(); err != nil {
		return Served{}, fmt.Errorf("attach %s: %w: %w", spec.VolumeID, err, errInvalid)
	}
	if sv := s.get(spec.VolumeID); sv != nil {
		if sv.st.File != spec.File {
			return Served{}, fmt.Errorf("attach %s: served from %s: %w", spec.VolumeID, sv.st.File, os.ErrExist)
		}
		if err := s.SetLimits(spec.VolumeID, spec.Limits); err != nil {
			return Served{}, err
		}
		return s.get(spec.VolumeID).info(), nil
	}
	if sv, ok, err := s.adoptRecorded(ctx, spec); ok || err != nil {
		if err == nil {
			s.setHeld(spec.VolumeID, nil)
		}
		return sv, err
	}
	file, size, dio, err := openBacking(spec)
	if err != nil {
		return Served{}, err
	}
	sv, err := s.create(ctx, spec, file, size, dio)
	if err != nil {
		if file != nil && !errors.Is(err, errQueuesLive) {
			// A queue that did not end may still use it: leaked, not
			// closed under its thread.
			file.Close()
		}
		return Served{}, err
	}
	s.put(spec.VolumeID, sv)
	return sv.info(), nil
}

func (s *Server) create(ctx context.Context, spec AttachSpec, file *os.File, size int64, dio uint32) (*served, error) {
	flags, err := addFlags(s.features, s.cfg.ZeroCopy, s.cfg.BatchIO, s.cfg.UserCopy)
	if err != nil {
		return nil, err
	}
	tun, err := ChooseTuning(TuningInput{CPUs: s.cfg.CPUs, Queues: spec.Queues, Depth: spec.Depth, MaxIOBytes: spec.MaxIOBytes,
		ZeroCopy: zeroCopy(flags), UserCopy: userCopy(flags), MemoryBudget: s.cfg.MemoryBudget})
	if err != nil {
		return nil, err
	}
	st := State{VolumeID: spec.VolumeID, File: spec.File, SizeBytes: size, ReadOnly: spec.ReadOnly, Tuning: tun,
		NowaitWrites: s.nowaitWrites(file, nil), KeepAllocated: spec.KeepAllocated, Limits: spec.Limits, Owner: s.owner}
	lim := qos.New(spec.Limits)
	var changes *cbt.Tracker
	if !spec.Null && s.cfg.Thread.Ablation.TracksChanges() {
		if changes, err = cbt.NewTracker(size, tun.Queues, spec.Changes, spec.ChangesTrusted); err != nil {
			return nil, fmt.Errorf("attach %s: %w: %w", spec.VolumeID, err, errInvalid)
		}
	}
	cfg := DeviceConfig{Target: st.target(file), SizeBytes: size, Tuning: tun, Flags: flags, ReadOnly: spec.ReadOnly, Changes: changes,
		DMAAlign: dio, Owner: s.owner, Queue: s.queueOptions(st.NowaitWrites), Limiter: lim, Threads: s.Threads(), Persist: func(info DevInfo) error {
			st.DevID, st.Flags = info.DevID, info.Flags
			if spec.Null {
				return nil // benchmark devices are never re-adopted
			}
			if err := saveState(s.cfg.StateDir, st); err != nil {
				return err
			}
			return failAt(fpStateSaved)
		}}
	dev, err := CreateDevice(ctx, s.ctl, cfg)
	if err != nil {
		if st.Flags != 0 && !spec.Null {
			err = errors.Join(err, removeState(s.cfg.StateDir, spec.VolumeID))
		}
		return nil, err
	}
	return &served{op: new(sync.Mutex), st: st, dev: dev, lim: lim, file: file, changes: changes}, nil
}

// queueOptions returns ServerConfig.Queue with NowaitWrites set to the
// device's choice (State.NowaitWrites, from nowaitWrites).
func (s *Server) queueOptions(nowait bool) QueueOptions {
	o := s.cfg.Queue
	o.NowaitWrites = nowait
	return o
}

// nowaitWrites chooses QueueOptions.NowaitWrites for a device backed by
// file (nil for the null target). On and off apply to every device. In
// auto mode a re-adopted device keeps the choice recorded in its State
// (adopted), and for a new one the file's filesystem is probed once
// (StaleMtimeRefusesNowait) and the answer remembered; a probe that fails
// (no O_TMPFILE or O_DIRECT there) answers false, so the writes take
// io_uring's usual path.
func (s *Server) nowaitWrites(file *os.File, adopted *State) bool {
	switch {
	case s.cfg.NowaitWrites != ModeAuto:
		return s.cfg.NowaitWrites == ModeOn
	case adopted != nil:
		return adopted.NowaitWrites
	case file == nil:
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		return false
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	refuses, ok := s.nowait[st.Dev]
	if !ok {
		refuses, _ = dataplane.StaleMtimeRefusesNowait(filepath.Dir(file.Name()))
		if s.nowait == nil {
			s.nowait = make(map[uint64]bool)
		}
		s.nowait[st.Dev] = refuses
	}
	return refuses
}

// openBacking opens the volume file for direct I/O and returns it, the
// device size and the file's direct-I/O memory alignment.
func openBacking(spec AttachSpec) (*os.File, int64, uint32, error) {
	if spec.Null {
		if spec.SizeBytes <= 0 {
			return nil, 0, 0, fmt.Errorf("null device: size %d: %w", spec.SizeBytes, errInvalid)
		}
		return nil, spec.SizeBytes, 0, nil
	}
	mode := os.O_RDWR
	if spec.ReadOnly {
		mode = os.O_RDONLY
	}
	f, err := os.OpenFile(spec.File, mode|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("open backing file: %w", err)
	}
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_SIZE|unix.STATX_DIOALIGN, &stx); err != nil {
		f.Close()
		return nil, 0, 0, fmt.Errorf("statx %s: %w", spec.File, err)
	}
	size := spec.SizeBytes
	if size == 0 {
		size = int64(stx.Size)
	}
	if stx.Dio_offset_align > 4096 || size > int64(stx.Size) {
		f.Close()
		return nil, 0, 0, fmt.Errorf("backing file %s: size %d (want %d), direct I/O alignment %d (max 4096): %w",
			spec.File, stx.Size, size, stx.Dio_offset_align, errInvalid)
	}
	return f, size, stx.Dio_mem_align, nil
}
