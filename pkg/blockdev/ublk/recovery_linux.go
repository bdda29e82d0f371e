package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// recoveryWait bounds how long a re-adoption waits for the device to be
// QUIESCED (or FAIL_IO) and retries START_USER_RECOVERY while the previous
// server's /dev/ublkcN is being released.
const recoveryWait = 30 * time.Second

// ErrDeviceWedged is the class of a re-adoption's failure when the device
// stays LIVE although no server serves it: the kernel's quiesce waits for a
// request that no server can answer, holding the device's mutex, so every
// control command that takes it would block (and leave a worker behind).
// Only a reboot of the node frees the device.
var ErrDeviceWedged = errors.New("ublk device stays LIVE with no server: it needs a reboot of the node")

// ErrNotOwned is returned when a device id does not carry the expected
// owner token: the id was reused by a device this process does not own.
var ErrNotOwned = errors.New("ublk device not owned")

// RecoverDevice re-adopts device id after the process that served it
// died or released it: START_USER_RECOVERY (retried on EBUSY until the old
// /dev/ublkcN is released), open /dev/ublkcN, start the queues,
// END_USER_RECOVERY with our pid. The block device and any mount on it are
// kept. A device not carrying cfg.Owner fails with ErrNotOwned and is left
// alone; an unknown id fails with an error matching unix.ENODEV. A failure
// after queues started that could not end them (shared threads without
// QUIESCE) wraps errQueuesLive and returns the device too: the caller keeps
// it and its target open until the threads end (Server.Close).
func RecoverDevice(ctx context.Context, ctl *Control, id uint32, cfg DeviceConfig) (*Device, error) {
	info, err := ctl.GetDevInfo(id)
	if err != nil {
		return nil, err
	}
	if info.UblksrvFlags != cfg.Owner {
		return nil, fmt.Errorf("recover ublk device %d: owner %#x, want %#x: %w", id, info.UblksrvFlags, cfg.Owner, ErrNotOwned)
	}
	if err := startRecovery(ctx, ctl, id, recoveryWait); err != nil {
		return nil, err
	}
	// START_USER_RECOVERY succeeds only on a device that was started.
	d := newDevice(ctl, info, true, cfg.Gate)
	if err := d.resume(ctx, cfg); err != nil {
		// Leave the device quiesced for a later attempt; only drop what
		// we opened. Queues that cannot be ended (shared threads
		// without QUIESCE) keep /dev/ublkcN open and the error wraps
		// errQueuesLive: the caller must keep the backing file open too.
		err = errors.Join(err, d.Release(context.WithoutCancel(ctx)))
		if errors.Is(err, errQueuesLive) {
			return d, err
		}
		return nil, err
	}
	if d.info, err = ctl.GetDevInfo(id); err != nil {
		d.info = info
	}
	return d, nil
}

// startRecovery sends START_USER_RECOVERY once the device is QUIESCED (or
// FAIL_IO), retrying on EBUSY while the old /dev/ublkcN is released, all
// within wait. GET_DEV_INFO, which the wait reads, does not take the
// device's mutex; START_USER_RECOVERY does, and would block behind a
// quiesce that never ends: a device still LIVE after wait fails with
// ErrDeviceWedged and is sent nothing more.
func startRecovery(ctx context.Context, ctl *Control, id uint32, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var state DevState
	err := poll(ctx, wait, func() (bool, error) {
		info, err := ctl.GetDevInfo(id)
		state = info.State
		return err == nil && (state == StateQuiesced || state == StateFailIO), err
	})
	if errors.Is(err, unix.ETIME) && state == StateLive {
		return fmt.Errorf("start user recovery of ublk device %d: still LIVE %v after its server ended: %w", id, wait, ErrDeviceWedged)
	}
	if err != nil {
		return fmt.Errorf("start user recovery of ublk device %d (state %d): %w", id, state, err)
	}
	err = poll(ctx, max(time.Until(deadline), time.Second), func() (bool, error) {
		err := ctl.StartUserRecovery(id)
		if errors.Is(err, unix.EBUSY) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("start user recovery of ublk device %d: %w", id, err)
	}
	return nil
}

func (d *Device) resume(ctx context.Context, cfg DeviceConfig) error {
	if err := d.openChar(ctx); err != nil {
		return err
	}
	if err := d.startQueues(cfg); err != nil {
		return err
	}
	if err := failAt(fpRecovering); err != nil {
		return err
	}
	return d.ctl.EndUserRecovery(d.ID(), os.Getpid())
}

// DeleteOwned stops and deletes device id if it carries owner; a device
// that is gone already is success, one owned by someone else is left
// alone and reported with ErrNotOwned. Used for orphans whose volume is
// gone: nobody serves them, so STOP_DEV fails their held I/O.
func DeleteOwned(ctl *Control, id uint32, owner uint64) error {
	info, err := ctl.GetDevInfo(id)
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.UblksrvFlags != owner {
		return fmt.Errorf("delete ublk device %d: %w", id, ErrNotOwned)
	}
	if err := ctl.StopDev(id); err != nil && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return deleteDev(ctl, id)
}

// ListIDs returns the ids of every ublk device (from /sys/class/ublk-char).
func ListIDs() ([]uint32, error) {
	ents, err := os.ReadDir("/sys/class/ublk-char")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ublk devices: %w", err)
	}
	var ids []uint32
	for _, e := range ents {
		n, ok := strings.CutPrefix(filepath.Base(e.Name()), "ublkc")
		if !ok {
			continue
		}
		if id, err := strconv.ParseUint(n, 10, 32); err == nil {
			ids = append(ids, uint32(id))
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// adopt runs at start-up. Per state file: a volume file that still exists
// gets its device re-adopted (user recovery); a missing volume file gets
// its device deleted; a device that is gone (reboot) or no longer ours
// just loses its state file. A state file that does not decode is set
// aside (see loadStates) and its device, whichever it is, left alone. Then
// the sweep (see sweep). Devices of other owners are never touched. The
// returned errors are per device; the server stays usable.
func (s *Server) adopt(ctx context.Context) []error {
	if err := atomicfile.RemoveStale(s.cfg.StateDir); err != nil {
		return []error{err}
	}
	scan, err := loadStates(s.cfg.StateDir, true)
	if err != nil {
		// Nothing is known: re-adopt nothing, delete nothing.
		return []error{fmt.Errorf("%w: no ublk device re-adopted or swept", err)}
	}
	errs := scan.problems
	for _, st := range scan.states {
		errs = append(errs, s.adoptOne(ctx, st))
	}
	errs = append(errs, s.sweep(scan)...)
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

// sweep deletes the devices carrying our owner token that no state names
// and that were never started: left by a crash between ADD_DEV and
// recording the device, they have no block device and no user. A device
// that was started may serve a volume whose state is lost, with a mount
// on it, so it is reported and left alone; and while any state file is
// unreadable (it may name any device) nothing is deleted.
func (s *Server) sweep(scan stateScan) []error {
	devs, err := s.unrecorded(scan.states)
	if err != nil {
		return []error{fmt.Errorf("sweep ublk devices: %w", err)}
	}
	var errs []error
	for _, info := range devs {
		id := info.DevID
		switch {
		case len(scan.unreadable) > 0:
			errs = append(errs, fmt.Errorf("ublk device %d is ours but no readable state names it; left alone while %q cannot be read", id, scan.unreadable))
		case info.State != StateDead:
			errs = append(errs, fmt.Errorf("ublk device %d is ours and was started but no state names it; left alone", id))
		default:
			if err := DeleteOwned(s.ctl, id, s.owner); err != nil && !errors.Is(err, ErrNotOwned) {
				errs = append(errs, fmt.Errorf("sweep ublk device %d: %w", id, err))
			}
		}
	}
	return errs
}

// unrecorded returns the devices carrying our owner token that no state
// of sts names.
func (s *Server) unrecorded(sts []State) ([]DevInfo, error) {
	recorded := map[uint32]bool{}
	for _, st := range sts {
		recorded[st.DevID] = true
	}
	ids, err := ListIDs()
	if err != nil {
		return nil, err
	}
	var out []DevInfo
	for _, id := range ids {
		if recorded[id] {
			continue
		}
		info, err := s.ctl.GetDevInfo(id)
		if errors.Is(err, unix.ENODEV) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("ublk device %d: %w", id, err)
		}
		if info.UblksrvFlags == s.owner {
			out = append(out, info)
		}
	}
	return out, nil
}

// checkUnreadable fails, with an error wrapping os.ErrExist, when the
// volume's state file is unreadable or set aside while some device of ours
// is not accounted for by a readable state: that device may serve the
// volume, so neither a new device nor "no device" would be safe.
func (s *Server) checkUnreadable(id string, scan stateScan) error {
	mine := scan.mine(id)
	if len(mine) == 0 {
		return nil
	}
	devs, err := s.unrecorded(scan.states)
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	if len(devs) == 0 {
		return nil // nothing it could name exists
	}
	ids := make([]uint32, len(devs))
	for i, d := range devs {
		ids[i] = d.DevID
	}
	return fmt.Errorf("volume %s: state %q in %s unreadable and ublk devices %v unaccounted for, one may serve it; "+
		"inspect them (csi-fastblk ublk list), delete the stale one, then remove the state file: %w", id, mine, s.cfg.StateDir, ids, os.ErrExist)
}

func (s *Server) adoptOne(ctx context.Context, st State) error {
	if st.Owner != s.owner {
		return removeState(s.cfg.StateDir, st.VolumeID)
	}
	if _, err := os.Stat(st.File); errors.Is(err, os.ErrNotExist) {
		return s.deleteRecorded(st)
	}
	info, err := s.ctl.GetDevInfo(st.DevID)
	switch {
	case errors.Is(err, unix.ENODEV) || (err == nil && info.UblksrvFlags != s.owner):
		return removeState(s.cfg.StateDir, st.VolumeID) // gone (a reboot), or the id reused
	case err != nil:
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	case info.State != StateLive && info.State != StateQuiesced && info.State != StateFailIO:
		// Recorded but never started (a crash before START_DEV) or
		// stopped: no block device, no user. Delete it; the next
		// Attach creates the device afresh.
		return s.deleteRecorded(st)
	}
	file, _, dio, err := openBacking(AttachSpec{VolumeID: st.VolumeID, File: st.File, SizeBytes: st.SizeBytes, ReadOnly: st.ReadOnly})
	if err != nil {
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	lim := qos.New(st.Limits)
	st.NowaitWrites = s.nowaitWrites(file, &st)
	// The old process's record: handed over at its stop (HandOver, or
	// Close), or lost with it (then the record starts untrusted, and the
	// volume's next snapshot's delta compares files).
	changes, st, err := s.takeHandover(st, file)
	if err != nil {
		file.Close()
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	dev, err := RecoverDevice(ctx, s.ctl, st.DevID, DeviceConfig{Target: st.target(file), Tuning: st.Tuning, DMAAlign: dio, Owner: s.owner,
		Queue: s.queueOptions(st.NowaitWrites), Limiter: lim, Threads: s.Threads(), Changes: changes})
	if err != nil {
		if errors.Is(err, errQueuesLive) {
			// Its queues still serve from that file: kept open, not
			// closed under them, until the threads end. The device
			// holds its I/O meanwhile, and health says so.
			s.hold(st.VolumeID, &stuck{dev: dev, file: file, err: err})
			return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
		}
		file.Close()
		if errors.Is(err, unix.ENODEV) || errors.Is(err, ErrNotOwned) {
			return removeState(s.cfg.StateDir, st.VolumeID)
		}
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	s.put(st.VolumeID, &served{op: new(sync.Mutex), st: st, dev: dev, lim: lim, file: file, recoveries: 1, changes: changes})
	return nil
}

// deleteRecorded deletes the recorded device (if still ours), then its
// state file.
func (s *Server) deleteRecorded(st State) error {
	if err := DeleteOwned(s.ctl, st.DevID, s.owner); err != nil && !errors.Is(err, ErrNotOwned) {
		return fmt.Errorf("delete ublk device %d of %s: %w", st.DevID, st.VolumeID, err)
	}
	return removeState(s.cfg.StateDir, st.VolumeID)
}

// Quarantined returns the paths of the state files set aside because they
// do not decode. Each stays until an operator inspects and removes it;
// meanwhile its device, if any, is left alone.
func (s *Server) Quarantined() []string {
	names, _ := Quarantined(s.cfg.StateDir)
	for i, n := range names {
		names[i] = filepath.Join(s.cfg.StateDir, n)
	}
	return names
}
