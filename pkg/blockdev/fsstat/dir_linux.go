package fsstat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// probePrefix names write-probe files. Each probe has its own random name,
// so concurrent probes never touch each other's file; a crash between
// create and remove leaves one empty-ish file behind.
const probePrefix = ".health-probe-"

// ProbeWrite proves dir accepts durable writes: it creates a probe file,
// writes and fsyncs a block, removes the file and fsyncs dir. Errors keep
// the errno reachable (EROFS, ENOSPC, EIO).
func ProbeWrite(dir string) error {
	f, err := os.CreateTemp(dir, probePrefix+"*")
	if err != nil {
		return fmt.Errorf("write probe in %s: %w", dir, err)
	}
	_, werr := f.Write(make([]byte, blockdev.SizeAlign))
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	rerr := os.Remove(f.Name())
	if err := errors.Join(werr, cerr, rerr); err != nil {
		return fmt.Errorf("write probe in %s: %w", dir, err)
	}
	return atomicfile.SyncDir(dir)
}

// ErrorRecord is a filesystem's own record of the errors it hit. ext4 keeps
// it in the superblock until e2fsck clears it, whatever its errors=
// behaviour (continue, remount-ro, panic).
type ErrorRecord struct {
	Count    int64
	LastTime time.Time // zero when unknown
	LastFunc string    // kernel function that reported the last error
}

// sysBlockDir and sysExt4Dir are where the kernel names block devices by
// number and publishes ext4's per-filesystem attributes (fs/ext4/sysfs.c).
const (
	sysBlockDir = "/sys/dev/block"
	sysExt4Dir  = "/sys/fs/ext4"
)

// Ext4Errors reads the error record of the ext4 filesystem on block device
// major:minor. A device with no mounted ext4 returns ErrNotFound.
func Ext4Errors(major, minor uint32) (ErrorRecord, error) {
	dev, err := os.Readlink(filepath.Join(sysBlockDir, fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return ErrorRecord{}, fmt.Errorf("block device %d:%d: %w", major, minor, err)
	}
	dir := filepath.Join(sysExt4Dir, filepath.Base(dev))
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b))
	}
	count, err := os.ReadFile(filepath.Join(dir, "errors_count"))
	if errors.Is(err, os.ErrNotExist) {
		return ErrorRecord{}, fmt.Errorf("ext4 on %s: %w", filepath.Base(dev), blockdev.ErrNotFound)
	}
	if err != nil {
		return ErrorRecord{}, fmt.Errorf("ext4 errors of %s: %w", filepath.Base(dev), err)
	}
	var e ErrorRecord
	if e.Count, err = strconv.ParseInt(strings.TrimSpace(string(count)), 10, 64); err != nil {
		return ErrorRecord{}, fmt.Errorf("ext4 errors_count %q: %w", count, blockdev.ErrInvalid)
	}
	if sec, err := strconv.ParseInt(read("last_error_time"), 10, 64); err == nil && sec > 0 {
		e.LastTime = time.Unix(sec, 0).UTC()
	}
	e.LastFunc = read("last_error_func")
	return e, nil
}
