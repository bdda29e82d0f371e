package ublk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// A volume whose state file was set aside (it did not decode) still has its
// device after a restart: started, carrying our owner token, its I/O held
// and perhaps a filesystem mounted on it. Nothing is lost by keeping it,
// but nothing is served either until the device is re-adopted, and the
// state file was what re-adoption read. heal rebuilds that State from the
// two records that survive it, and re-adopts only where they agree:
//
//   - the volume's own record, from the caller (the store): its file, size
//     and read-only flag, and the device recorded with it, the target of
//     its stable link (AttachSpec.RecordedDev);
//   - the kernel's view of that device: GET_DEV_INFO (owner token, state,
//     flags, queues, depth, request size) and GET_PARAMS (size, block
//     size, read-only attribute).
//
// What decides where the data goes is never guessed: the device's size
// must equal the recorded size, its blocks be the 4 KiB ones every device
// here has, its read-only attribute match, and the backing file exist
// with room for the whole device. The queue geometry and flags come from
// the kernel (the device keeps them across the restart; re-adoption must
// use them anyway). Rate limits and KeepAllocated (a preallocated volume's
// zeroing in place) come from the caller's record, as Attach applies them. NowaitWrites is left off, io_uring's usual write path,
// which is correct on every filesystem; only its speed depends on it.

// ErrDisagree is the class of a volume whose device cannot be re-adopted
// because its state file is lost and the volume's record and the kernel's
// view of the device disagree: the device is kept, its I/O held, and
// Server.Held reports it until an operator resolves it.
var ErrDisagree = errors.New("the volume's record and its device disagree")

// kernelDevice is the kernel's view of one device.
type kernelDevice struct {
	info   DevInfo
	params uapi.Params
	err    error // GET_PARAMS failed
}

// healState judges whether the device the volume's record names is the
// volume's device, and returns the State to re-adopt it with; or an error
// wrapping ErrDisagree that says what disagrees. mine are the volume's
// entries among the unreadable state files; devs are the started devices
// of owner that no readable state names.
func healState(spec AttachSpec, owner uint64, mine []string, devs []kernelDevice) (State, error) {
	disagree := func(format string, args ...any) (State, error) {
		return State{}, fmt.Errorf("volume %s: %s: %w", spec.VolumeID, fmt.Sprintf(format, args...), ErrDisagree)
	}
	for _, name := range mine {
		if !strings.Contains(name, stateSuffix+corruptMark) {
			// Not read (a permission or I/O error), not set aside: a
			// new state would overwrite what it holds.
			return disagree("state file %s cannot be read and is not set aside", name)
		}
	}
	n, ok := strings.CutPrefix(spec.RecordedDev, "/dev/ublkb")
	id, err := strconv.ParseUint(n, 10, 32)
	switch {
	case spec.RecordedDev == "":
		return disagree("no device is recorded with the volume")
	case !ok || err != nil:
		return disagree("its recorded device %s is not a ublk block device", spec.RecordedDev)
	}
	var dev *kernelDevice
	for i := range devs {
		if devs[i].info.DevID == uint32(id) {
			dev = &devs[i]
		}
	}
	if dev == nil {
		return disagree("its recorded device %s is not a started device of this plugin that no state names", spec.RecordedDev)
	}
	info, p := dev.info, dev.params.Basic
	size := int64(p.DevSectors) << 9
	ro := p.Attrs&uapi.AttrReadOnly != 0
	switch {
	case info.UblksrvFlags != owner:
		return disagree("device %d carries owner %#x, not %#x", id, info.UblksrvFlags, owner)
	case info.State != StateLive && info.State != StateQuiesced && info.State != StateFailIO:
		return disagree("device %d was not started (state %d)", id, info.State)
	case dev.err != nil:
		return disagree("device %d: %v", id, dev.err)
	case dev.params.Types&uapi.ParamTypeBasic == 0:
		return disagree("device %d has no basic parameters", id)
	case size != spec.SizeBytes:
		return disagree("device %d has %d bytes, the volume %d", id, size, spec.SizeBytes)
	case p.LogicalBSShift != 12:
		return disagree("device %d has %d-byte blocks, not 4096", id, 1<<p.LogicalBSShift)
	case ro != spec.ReadOnly:
		return disagree("device %d read-only %t, the volume %t", id, ro, spec.ReadOnly)
	}
	fi, err := os.Stat(spec.File)
	switch {
	case err != nil:
		return disagree("backing file: %v", err)
	case !fi.Mode().IsRegular():
		return disagree("backing file %s is not a regular file", spec.File)
	case fi.Size() < size:
		return disagree("backing file %s has %d bytes, device %d has %d", spec.File, fi.Size(), id, size)
	}
	t := Tuning{Queues: int(info.NrHWQueues), Depth: int(info.QueueDepth), MaxIOBytes: info.MaxIOBufBytes,
		ZeroCopy: zeroCopy(info.Flags), UserCopy: userCopy(info.Flags)}
	switch {
	case t.UserCopy:
		// The plugin's servers keep the default budget.
		t.PoolBytes = userCopyPool(t, DefaultMemoryBudget)
		t.BufferBytes = userCopyTagBytes(t) + t.PoolBytes
	case !t.ZeroCopy:
		t.BufferBytes = int64(t.Queues) * int64(t.Depth) * int64(t.MaxIOBytes)
	}
	st := State{VolumeID: spec.VolumeID, DevID: info.DevID, File: spec.File, SizeBytes: size, ReadOnly: spec.ReadOnly,
		Tuning: t, Limits: spec.Limits, KeepAllocated: spec.KeepAllocated, Flags: info.Flags, Owner: info.UblksrvFlags}
	if err := st.validate(); err != nil {
		return disagree("device %d: %v", id, err)
	}
	return st, nil
}

// heal re-adopts the volume's device when its state file is unreadable
// and its device unaccounted for (checkUnreadable failed with cause), if
// the volume's record and the kernel agree (healState); it then writes a
// good state file and marks the set-aside one healed. Where they disagree
// the device is left alone, its I/O held, and Held reports why.
func (s *Server) heal(ctx context.Context, spec AttachSpec, cause error) (Served, error) {
	s.healMu.Lock()
	defer s.healMu.Unlock()
	// Read again under the lock: a device another heal re-adopted since is
	// recorded now, no longer unaccounted for.
	scan, err := loadStates(s.cfg.StateDir, false)
	if err != nil {
		return Served{}, fmt.Errorf("attach %w: %w", cause, err)
	}
	infos, err := s.unrecorded(scan.states)
	if err != nil {
		return Served{}, fmt.Errorf("attach %w: %w", cause, err)
	}
	var devs []kernelDevice
	for _, info := range infos {
		if s.failingDevice(info.DevID) {
			// Its I/O fails, served by this process: re-adopting it
			// for the volume takes a restart (FailUnservedAfter).
			continue
		}
		p, err := s.ctl.getParams(info.DevID)
		devs = append(devs, kernelDevice{info: info, params: p, err: err})
	}
	mine := scan.mine(spec.VolumeID)
	st, err := healState(spec, s.owner, mine, devs)
	if err != nil {
		s.setHeld(spec.VolumeID, err)
		return Served{}, fmt.Errorf("attach %w; not re-adopted: %w", cause, err)
	}
	if err := saveState(s.cfg.StateDir, st); err != nil {
		return Served{}, fmt.Errorf("attach %s: %w", spec.VolumeID, err)
	}
	if err := s.adoptOne(ctx, st); err != nil {
		return Served{}, err // recorded now: the next Attach retries as usual
	}
	sv := s.get(spec.VolumeID)
	if sv == nil {
		return Served{}, fmt.Errorf("attach %s: device %d not re-adopted", spec.VolumeID, st.DevID)
	}
	for _, name := range mine {
		if err := os.Rename(filepath.Join(s.cfg.StateDir, name), filepath.Join(s.cfg.StateDir, name+healedMark)); err != nil && s.cfg.Report != nil {
			s.cfg.Report(err, "cannot mark the set-aside state file healed", "volumeID", spec.VolumeID)
		}
	}
	return sv.info(), nil
}

// Held returns, by volume, why a device kept for the volume is not served:
// its state file is unreadable and the volume's record and the kernel's
// view of the device disagree (ErrDisagree). The device holds its I/O.
//
// This is deliberately not part of Health. Health fails the plugin's
// liveness, and the kubelet restarts it; that heals what a restart heals
// (a failed thread, a stuck re-adoption), but a disagreement survives any
// restart: the next process reads the same records and holds the same
// device, so failing liveness would only restart the plugin in a loop,
// taking every other volume's device through a recovery each time. An
// operator must decide; the volume's health condition and the node status
// say so.
//
// While devices that no record names fail their I/O (FailUnservedAfter),
// each held volume's reason names them too, wrapping ErrFailingIO: the
// server cannot tell which of them is the volume's.
func (s *Server) Held() map[string]error {
	note := s.failingNote()
	s.mu.Lock()
	defer s.mu.Unlock()
	held := maps.Clone(s.held)
	if note != "" {
		for id, err := range held {
			held[id] = fmt.Errorf("%w; ublk devices that no record names (%w): %s", err, ErrFailingIO, note)
		}
	}
	return held
}

// setHeld records (err non-nil) or forgets why the volume's device is held.
func (s *Server) setHeld(id string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.held, id)
		return
	}
	if s.held == nil {
		s.held = map[string]error{}
	}
	s.held[id] = err
}
