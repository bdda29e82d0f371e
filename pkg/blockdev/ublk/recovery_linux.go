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
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// recoveryWait bounds how long START_USER_RECOVERY is retried while the
// previous server's /dev/ublkcN is being released.
const recoveryWait = 30 * time.Second

// ErrNotOwned is returned when a device id does not carry the expected
// owner token: the id was reused by a device this process does not own.
var ErrNotOwned = errors.New("ublk device not owned")

// RecoverDevice re-adopts device id after the process that served it
// died or released it: START_USER_RECOVERY (retried on EBUSY until the old
// /dev/ublkcN is released), open /dev/ublkcN, start the queues,
// END_USER_RECOVERY with our pid. The block device and any mount on it are
// kept. A device not carrying cfg.Owner fails with ErrNotOwned and is left
// alone; an unknown id fails with an error matching unix.ENODEV.
func RecoverDevice(ctx context.Context, ctl *Control, id uint32, cfg DeviceConfig) (*Device, error) {
	info, err := ctl.GetDevInfo(id)
	if err != nil {
		return nil, err
	}
	if info.UblksrvFlags != cfg.Owner {
		return nil, fmt.Errorf("recover ublk device %d: owner %#x, want %#x: %w", id, info.UblksrvFlags, cfg.Owner, ErrNotOwned)
	}
	if err := startRecovery(ctx, ctl, id); err != nil {
		return nil, err
	}
	d := &Device{ctl: ctl, info: info, char: -1}
	if err := d.resume(ctx, cfg); err != nil {
		// Leave the device quiesced for a later attempt; only drop what we opened.
		return nil, errors.Join(err, d.Release(context.WithoutCancel(ctx)))
	}
	if d.info, err = ctl.GetDevInfo(id); err != nil {
		d.info = info
	}
	return d, nil
}

func startRecovery(ctx context.Context, ctl *Control, id uint32) error {
	err := poll(ctx, recoveryWait, func() (bool, error) {
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
// just loses its state file. Devices carrying our owner token that no
// state file names (a crash between ADD_DEV and recording it; never
// started) are deleted. Devices of other owners are never touched. The
// returned errors are per device; the server stays usable.
func (s *Server) adopt(ctx context.Context) []error {
	sts, err := loadStates(s.cfg.StateDir)
	errs := []error{err}
	recorded := map[uint32]bool{}
	for _, st := range sts {
		recorded[st.DevID] = true
		errs = append(errs, s.adoptOne(ctx, st))
	}
	ids, err := ListIDs()
	errs = append(errs, err)
	for _, id := range ids {
		if recorded[id] {
			continue
		}
		if err := DeleteOwned(s.ctl, id, s.owner); err != nil && !errors.Is(err, ErrNotOwned) {
			errs = append(errs, fmt.Errorf("sweep ublk device %d: %w", id, err))
		}
	}
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

func (s *Server) adoptOne(ctx context.Context, st State) error {
	if st.Owner != s.owner {
		return removeState(s.cfg.StateDir, st.VolumeID)
	}
	if _, err := os.Stat(st.File); errors.Is(err, os.ErrNotExist) {
		if err := DeleteOwned(s.ctl, st.DevID, s.owner); err != nil && !errors.Is(err, ErrNotOwned) {
			return fmt.Errorf("delete orphan ublk device %d of %s: %w", st.DevID, st.VolumeID, err)
		}
		return removeState(s.cfg.StateDir, st.VolumeID)
	}
	// Starting the queues without room for their threads would crash the
	// process and every device with it; the device stays recorded, its
	// I/O held, for a later Attach once the limit allows.
	if err := s.checkThreads(st.Tuning.Queues); err != nil {
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	file, _, dio, err := openBacking(AttachSpec{VolumeID: st.VolumeID, File: st.File, SizeBytes: st.SizeBytes, ReadOnly: st.ReadOnly})
	if err != nil {
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	lim := qos.New(st.Limits)
	st.NowaitWrites = s.nowaitWrites(file, &st)
	dev, err := RecoverDevice(ctx, s.ctl, st.DevID, DeviceConfig{Target: FileTarget(int(file.Fd())), DMAAlign: dio, Owner: s.owner,
		Queue: s.queueOptions(st.NowaitWrites), Limiter: lim, Threads: s.threads})
	if err != nil {
		file.Close()
		if errors.Is(err, unix.ENODEV) || errors.Is(err, ErrNotOwned) {
			return removeState(s.cfg.StateDir, st.VolumeID)
		}
		return fmt.Errorf("re-adopt %s: %w", st.VolumeID, err)
	}
	s.put(st.VolumeID, &served{st: st, dev: dev, lim: lim, file: file, recovered: true})
	return nil
}
