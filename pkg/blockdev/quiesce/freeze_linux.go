package quiesce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int)
// from include/uapi/linux/fs.h; x/sys/unix does not name them. The kernel
// ignores the argument (fs/ioctl.c, do_vfs_ioctl).
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// frozenDir, below the data directory, holds one record per filesystem the
// plugin has frozen and not yet thawed: <dir>/frozen/<volume-id>.json.
const (
	frozenDir    = "frozen"
	recordSuffix = ".json"
)

// FreezeFS freezes the filesystem mounted at mountPath (FIFREEZE on its root
// directory): dirty data is written to the device and new writes block until
// thaw is called. thaw is safe to call more than once; only the first call
// thaws.
//
// A filesystem that is already frozen returns an error wrapping blockdev.ErrBusy; one
// that cannot be frozen (no freeze support) wraps blockdev.ErrNotSupported.
//
// A frozen filesystem stays frozen when the process that froze it dies; the
// plugin freezes through FreezeVolume, which records the freeze first so
// that the next start can thaw it.
func FreezeFS(ctx context.Context, mountPath string) (thaw func() error, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	fd, err := unix.Open(mountPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	if _, err := unix.IoctlRetInt(fd, fiFreeze); err != nil {
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.EBUSY):
			err = fmt.Errorf("%w: %w", blockdev.ErrBusy, err)
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
			err = fmt.Errorf("%w: %w", blockdev.ErrNotSupported, err)
		}
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	var once sync.Once
	var terr error
	return func() error {
		once.Do(func() {
			defer unix.Close(fd)
			if _, err := unix.IoctlRetInt(fd, fiThaw); err != nil {
				terr = fmt.Errorf("thaw %s: %w", mountPath, err)
			}
		})
		return terr
	}, nil
}

// FreezeRecord is the durable intent to freeze a volume's filesystem,
// written before FIFREEZE and removed after FITHAW.
type FreezeRecord struct {
	VolumeID  string `json:"volumeID"`
	MountPath string `json:"mountPath"`
	// Dev is the st_dev of the mount's root: the filesystem that was
	// frozen, whatever is mounted at MountPath later.
	Dev      uint64    `json:"dev"`
	FrozenAt time.Time `json:"frozenAt"`
}

// FreezeVolume freezes the volume's filesystem mounted at mountPath as
// FreezeFS does, after recording the freeze durably in the data directory
// dataDir. thaw thaws it and then removes the record; a process that
// dies in between leaves the record, and ThawAbandoned, called at start,
// thaws what it names. The caller serialises freezes of one volume.
//
// device is the volume's block device: the filesystem at mountPath must be
// the one on it, else FreezeVolume returns an error wrapping blockdev.ErrBusy and
// freezes nothing (a staging path whose mount is gone, after a reboot,
// is a directory of the host's filesystem, which must never be frozen).
func FreezeVolume(ctx context.Context, dataDir, volumeID, mountPath, device string) (thaw func() error, err error) {
	if !blockdev.IsVolumeID(volumeID) {
		return nil, fmt.Errorf("freeze %q: not a volume ID: %w", volumeID, blockdev.ErrInvalid)
	}
	var st, dev unix.Stat_t
	if err := unix.Stat(mountPath, &st); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", mountPath, err)
	}
	if err := unix.Stat(device, &dev); err != nil {
		// Staged in the record but not attached (yet, after a reboot).
		return nil, fmt.Errorf("freeze %s: device %s: %w: %w", volumeID, device, blockdev.ErrBusy, err)
	}
	if dev.Mode&unix.S_IFMT != unix.S_IFBLK || st.Dev != dev.Rdev {
		return nil, fmt.Errorf("freeze %s: %s does not hold the filesystem of %s (device %d:%d, not %d:%d): %w",
			volumeID, mountPath, device, unix.Major(st.Dev), unix.Minor(st.Dev), unix.Major(dev.Rdev), unix.Minor(dev.Rdev), blockdev.ErrBusy)
	}
	rec := FreezeRecord{VolumeID: volumeID, MountPath: mountPath, Dev: st.Dev, FrozenAt: time.Now().UTC()}
	if err := writeFreezeRecord(dataDir, rec); err != nil {
		return nil, fmt.Errorf("freeze %s: record intent: %w", volumeID, err)
	}
	fsThaw, err := FreezeFS(ctx, mountPath)
	if err != nil {
		// Not frozen by us (or already frozen by someone else): nothing
		// for a later start to thaw.
		return nil, errors.Join(err, atomicfile.Remove(freezeRecordPath(dataDir, volumeID)))
	}
	failpoint("frozen") // test builds: killed here, frozen, by test/plugin
	var once sync.Once
	var terr error
	return func() error {
		once.Do(func() {
			if terr = fsThaw(); terr == nil {
				terr = atomicfile.Remove(freezeRecordPath(dataDir, volumeID))
			}
		})
		return terr
	}, nil
}

func freezeRecordPath(dataDir, volumeID string) string {
	return filepath.Join(dataDir, frozenDir, volumeID+recordSuffix)
}

func writeFreezeRecord(dataDir string, rec FreezeRecord) error {
	if err := os.MkdirAll(filepath.Join(dataDir, frozenDir), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(freezeRecordPath(dataDir, rec.VolumeID), append(data, '\n'))
}

// ThawAbandoned thaws every filesystem of dataDir's volumes that an earlier
// run of the plugin froze and did not thaw (it was killed during a snapshot or clone), and removes
// their records. A record is thawed on the filesystem it names (by device
// number): at its mount path, or wherever that filesystem is still mounted;
// one no longer mounted anywhere is simply removed, and a filesystem that
// is not frozen any more is fine. Records that cannot be read or thawed
// stay for the next start and are reported in the error; the others are
// still processed. It returns the records it thawed.
func ThawAbandoned(dataDir string) ([]FreezeRecord, error) {
	dir := filepath.Join(dataDir, frozenDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("thaw abandoned freezes: %w", err)
	}
	var thawed []FreezeRecord
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, atomicfile.TempPrefix) {
			// A record never completed: FIFREEZE was not called.
			errs = append(errs, atomicfile.Remove(filepath.Join(dir, name)))
			continue
		}
		rec, err := readFreezeRecord(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done, err := thawRecorded(rec)
		if err != nil {
			errs = append(errs, fmt.Errorf("thaw %s at %s: %w", rec.VolumeID, rec.MountPath, err))
			continue
		}
		if done {
			thawed = append(thawed, rec)
		}
		errs = append(errs, atomicfile.Remove(filepath.Join(dir, name)))
	}
	return thawed, errors.Join(errs...)
}

func readFreezeRecord(file string) (FreezeRecord, error) {
	var rec FreezeRecord
	data, err := os.ReadFile(file)
	if err != nil {
		return rec, fmt.Errorf("read freeze record: %w", err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("decode freeze record %s: %w", file, err)
	}
	if !blockdev.IsVolumeID(rec.VolumeID) || filepath.Base(file) != rec.VolumeID+recordSuffix ||
		!filepath.IsAbs(rec.MountPath) || filepath.Clean(rec.MountPath) != rec.MountPath {
		return rec, fmt.Errorf("freeze record %s: bad volume ID or mount path: %w", file, blockdev.ErrInvalid)
	}
	return rec, nil
}

// thawRecorded thaws the filesystem rec names. It reports whether that
// filesystem was frozen and is now thawed; false with a nil error when it
// was not frozen or is not mounted any more.
func thawRecorded(rec FreezeRecord) (bool, error) {
	path, err := mountOf(rec)
	if err != nil || path == "" {
		return false, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	_, err = unix.IoctlRetInt(fd, fiThaw)
	if errors.Is(err, unix.EINVAL) {
		return false, nil // not frozen
	}
	return err == nil, err
}

// mountOf finds where the filesystem rec froze is mounted: its recorded
// mount path if that still holds it, else any mount of the same device (a
// bind mount of part of it will do: FITHAW acts on the whole filesystem);
// "" when it is mounted nowhere.
func mountOf(rec FreezeRecord) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(rec.MountPath, &st); err == nil && st.Dev == rec.Dev {
		return rec.MountPath, nil
	}
	mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find mount of device %d:%d: %w", unix.Major(rec.Dev), unix.Minor(rec.Dev), err)
	}
	for _, mi := range mis {
		if uint32(mi.Major) == unix.Major(rec.Dev) && uint32(mi.Minor) == unix.Minor(rec.Dev) {
			return mi.MountPoint, nil
		}
	}
	return "", nil
}
