package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// DefaultDevDir holds the stable device links when Config.DevDir is "".
const DefaultDevDir = "/dev/fastblk"

// loopBlockSize is the logical block size of loop devices: 4 KiB, so that
// the loop device's direct I/O on the backing file is aligned on 4 KiB-sector
// disks and mkfs picks 4 KiB sectors (ext4 and xfs both accept them).
const loopBlockSize = 4096

// detachTimeout bounds the wait for the kernel to release a loop device.
const detachTimeout = 30 * time.Second

// loopBackend exposes volume files through kernel loop devices with direct
// I/O. It keeps no state: each device it binds carries the mark
// "fastblk:<owner token>:<volume id>" as its lo_file_name, which the
// kernel keeps, so devices are found again after a restart. It acts only on
// devices with its mark, never by backing path: another user of the kernel
// (another node on the same kernel, losetup) can bind the same path.
type loopBackend struct {
	// volDirs are <DataDir>/volumes and each class directory's
	// volumes/, symlinks resolved; the first is DataDir's.
	volDirs []string
	devDir  string
	owner   uint64
}

// markPrefix starts the mark of every device of this backend's owner.
func (b *loopBackend) markPrefix() string { return fmt.Sprintf("fastblk:%016x:", b.owner) }

// mark is the lo_file_name of the volume's device.
func (b *loopBackend) mark(id string) string { return b.markPrefix() + id }

var _ blockdev.Backend = (*loopBackend)(nil)

func newLoopBackend(cfg Config) (blockdev.Backend, error) {
	if _, err := os.Stat(loop.Control); err != nil {
		return nil, fmt.Errorf("loop backend: %w: %w", blockdev.ErrNotSupported, err)
	}
	var volDirs []string
	for _, dir := range append([]string{cfg.DataDir}, cfg.ClassDirs...) {
		volDir := filepath.Join(dir, blockdev.VolumesDir)
		if err := os.MkdirAll(volDir, 0o700); err != nil {
			return nil, fmt.Errorf("loop backend: %w", err)
		}
		volDir, err := filepath.EvalSymlinks(volDir)
		if err == nil {
			volDir, err = filepath.Abs(volDir)
		}
		if err != nil {
			return nil, fmt.Errorf("loop backend: %w", err)
		}
		volDirs = append(volDirs, volDir)
	}
	b := &loopBackend{volDirs: volDirs, devDir: cfg.DevDir, owner: cfg.Owner}
	if b.devDir == "" {
		b.devDir = DefaultDevDir
	}
	if cfg.AdoptUnmarked {
		if err := b.adoptUnmarked(filepath.Join(cfg.DataDir, loopMarked)); err != nil {
			return nil, fmt.Errorf("loop backend: %w", err)
		}
	}
	return b, nil
}

// loopMarked, in the data directory, records that adoptUnmarked ran.
const loopMarked = "loop-marked"

// adoptUnmarked marks, unless done already, the devices a plugin without
// owner marks bound to this data directory's volume files: their
// lo_file_name is their backing file's path cut to loop.MaxMark bytes (as
// losetup names them, hence only once) and their backing inode is the
// volume file's. Marking is idempotent, so a crash before done is
// recorded only repeats it.
func (b *loopBackend) adoptUnmarked(done string) error {
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	all, err := loop.List()
	if err != nil {
		return err
	}
	for _, d := range all {
		id, ok := strings.CutSuffix(filepath.Base(d.BackingFile), blockdev.ImageSuffix)
		if !ok || !blockdev.IsVolumeID(id) || d.Deleted || d.Mark != d.BackingFile[:min(len(d.BackingFile), loop.MaxMark)] {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(b.file(b.volDirs[0], id), &st); err != nil || st.Dev != d.BackingDev || st.Ino != d.BackingInode {
			continue // not this directory's file, whatever its path says
		}
		if err := loop.SetMark(d.Path, b.mark(id)); err != nil {
			return fmt.Errorf("adopt %s of %s: %w", d.Path, id, err)
		}
	}
	if err := atomicfile.Create(done, nil); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

func (b *loopBackend) Name() string { return "loop" }

func (b *loopBackend) Close() error { return nil }

// file is the backing file of a volume in volDir as the kernel reports it.
func (b *loopBackend) file(volDir, id string) string {
	return filepath.Join(volDir, id+blockdev.ImageSuffix)
}

// isFile reports whether path is the volume's file in one of the data
// directories.
func (b *loopBackend) isFile(path, id string) bool {
	for _, dir := range b.volDirs {
		if path == b.file(dir, id) {
			return true
		}
	}
	return false
}

// Attach binds the volume file to a loop device, or returns the device that
// already serves it, and points <DevDir>/<id> at it.
func (b *loopBackend) Attach(ctx context.Context, req blockdev.AttachRequest) (blockdev.Device, error) {
	if !blockdev.IsVolumeID(req.VolumeID) {
		return blockdev.Device{}, fmt.Errorf("attach %q: not a volume ID: %w", req.VolumeID, blockdev.ErrInvalid)
	}
	if !req.Limits.IsZero() {
		return blockdev.Device{}, fmt.Errorf("attach %s: rate limits (%v): the loop backend cannot enforce them, ublk can: %w",
			req.VolumeID, req.Limits, blockdev.ErrNotSupported)
	}
	file, err := b.checkFile(req.File, req.VolumeID)
	if err != nil {
		return blockdev.Device{}, err
	}
	d, err := b.find(req.VolumeID)
	if errors.Is(err, blockdev.ErrNotFound) {
		d, err = loop.Attach(file, loop.Options{ReadOnly: req.ReadOnly, DirectIO: true, BlockSize: loopBlockSize, Mark: b.mark(req.VolumeID)})
	}
	if err != nil {
		return blockdev.Device{}, fmt.Errorf("attach %s: %w", req.VolumeID, err)
	}
	dev := b.device(req.VolumeID, d)
	if err := replaceLink(dev.Link, dev.Path); err != nil {
		return blockdev.Device{}, fmt.Errorf("attach %s: %w", req.VolumeID, err)
	}
	return dev, nil
}

// checkFile accepts only the volume's own file under one of the data
// directories, and returns it as the kernel will report it.
func (b *loopBackend) checkFile(given, id string) (string, error) {
	real, err := filepath.EvalSymlinks(given)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("attach %s: %w", given, blockdev.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("attach %s: %w", given, err)
	}
	if !b.isFile(real, id) {
		return "", fmt.Errorf("attach %s: not the file of volume %s in a data directory (%s): %w", given, id, strings.Join(b.volDirs, ", "), blockdev.ErrInvalid)
	}
	return real, nil
}

// find returns our loop device serving the volume's current file, or
// ErrNotFound. Devices still bound to a deleted file of the same name (an
// earlier volume) do not count.
func (b *loopBackend) find(id string) (loop.Device, error) {
	found, err := loop.FindMark(b.mark(id))
	if err != nil {
		return loop.Device{}, err
	}
	for _, d := range found {
		if !d.Deleted && b.isFile(d.BackingFile, id) {
			return d, nil
		}
	}
	return loop.Device{}, fmt.Errorf("volume %s has no loop device: %w", id, blockdev.ErrNotFound)
}

func (b *loopBackend) device(id string, d loop.Device) blockdev.Device {
	return blockdev.Device{
		VolumeID: id, Path: d.Path, Link: filepath.Join(b.devDir, id),
		Backend: b.Name(), SizeBytes: d.SizeBytes,
	}
}

// Detach unbinds every loop device of ours bound for the volume (also to a
// deleted file) and removes its link. A mounted device returns ErrBusy and
// stays attached.
func (b *loopBackend) Detach(ctx context.Context, volumeID string) error {
	if !blockdev.IsVolumeID(volumeID) {
		return nil
	}
	found, err := loop.FindMark(b.mark(volumeID))
	if err != nil {
		return fmt.Errorf("detach %s: %w", volumeID, err)
	}
	for _, d := range found {
		err := loop.Detach(d.Path, detachTimeout)
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("detach %s: %w: %w", volumeID, blockdev.ErrBusy, err)
		}
		if err != nil {
			return fmt.Errorf("detach %s: %w", volumeID, err)
		}
	}
	link := filepath.Join(b.devDir, volumeID)
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detach %s: %w", volumeID, err)
	}
	return nil
}

// Resize makes the device take the file's size (LOOP_SET_CAPACITY). The
// file must already have grown to at least sizeBytes.
func (b *loopBackend) Resize(ctx context.Context, volumeID string, sizeBytes int64) error {
	if !blockdev.IsVolumeID(volumeID) {
		return fmt.Errorf("resize %q: %w", volumeID, blockdev.ErrNotFound)
	}
	d, err := b.find(volumeID)
	if err != nil {
		return fmt.Errorf("resize %s: %w", volumeID, err)
	}
	size, err := loop.SetCapacity(d.Path)
	if err != nil {
		return fmt.Errorf("resize %s: %w", volumeID, err)
	}
	if size < sizeBytes {
		return fmt.Errorf("resize %s: device has %d bytes, want %d (file not grown?): %w", volumeID, size, sizeBytes, blockdev.ErrInvalid)
	}
	return nil
}

// List returns the loop devices carrying our mark that serve a volume file
// of the data directories.
func (b *loopBackend) List(ctx context.Context) ([]blockdev.Device, error) {
	all, err := loop.List()
	if err != nil {
		return nil, err
	}
	var out []blockdev.Device
	for _, d := range all {
		id, ok := strings.CutPrefix(d.Mark, b.markPrefix())
		if ok && blockdev.IsVolumeID(id) && b.isFile(d.BackingFile, id) {
			out = append(out, b.device(id, d))
		}
	}
	return out, nil
}

// replaceLink makes link a symlink to target atomically (symlink to a temp
// name, rename over link), creating link's directory.
func replaceLink(link, target string) error {
	if cur, err := os.Readlink(link); err == nil && cur == target {
		return nil
	}
	dir := filepath.Dir(link)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("link %s: %w", link, err)
	}
	tmp := filepath.Join(dir, atomicfile.TempPrefix+filepath.Base(link))
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("link %s: %w", link, err)
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("link %s: %w", link, err)
	}
	return nil
}
