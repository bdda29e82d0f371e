package filecopy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// MakeFile creates file with size bytes: sparse (ftruncate) when src is "",
// otherwise a clone of src (see cloneFile) grown to size. The file and its
// directory entry are durable when it returns. A stale file left by an
// earlier failed attempt is replaced.
func MakeFile(ctx context.Context, file, src string, size int64) error {
	if err := CopyFile(ctx, file, src, size); err != nil {
		return err
	}
	return SyncFile(file)
}

// CopyFile is MakeFile without the sync, for a copy that is made exact
// (ResyncFile) before it is synced, or that need not outlive a crash.
func CopyFile(ctx context.Context, file, src string, size int64) error {
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", file, err)
	}
	out, err := unix.Open(file, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", file, err)
	}
	defer unix.Close(out)
	if src != "" {
		if err := cloneFile(ctx, out, src); err != nil {
			return fmt.Errorf("copy %s to %s: %w", src, file, err)
		}
	}
	if err := unix.Ftruncate(out, size); err != nil {
		return fmt.Errorf("truncate %s: %w", file, err)
	}
	return nil
}

// SyncFile makes file and its directory entry durable.
func SyncFile(file string) error {
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", file, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", file, err)
	}
	return atomicfile.SyncDir(filepath.Dir(file))
}

// GrowFile extends file to size bytes (never shrinks) and syncs it.
func GrowFile(file string, size int64) error {
	fd, old, err := openWrite(file)
	if err != nil {
		return fmt.Errorf("grow %s: %w", file, err)
	}
	defer unix.Close(fd)
	if old < size {
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("grow %s: %w", file, err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("grow %s: %w", file, err)
	}
	return nil
}

// Allocate gives file disk blocks for [from, to) with fallocate mode 0 and
// syncs it; the file grows to at least to bytes. The blocks read as zeros
// and no other writer can take them, but the filesystem records them as
// unwritten (ext4, xfs), so a first write into one still converts its
// extent. With written, zeros are then written over what were holes of the
// range (see writeZeros), never over data (a clone's), so that a first
// write is a plain overwrite. A failure (ENOSPC) gives back what it
// allocated beyond the file's old size, since the filesystem may keep part
// of the range.
//
// It takes no context: writing zeros over a large volume outlasts a CSI
// call's deadline, and the retried call should find the work done (it
// waits for the volume's guard), not begun again.
func Allocate(file string, from, to int64, written bool) error {
	fd, old, err := openWrite(file)
	if err != nil {
		return fmt.Errorf("allocate %s: %w", file, err)
	}
	defer unix.Close(fd)
	if to <= from {
		return nil
	}
	var holes [][2]int64
	if written {
		// Before the allocation, which makes holes unwritten extents
		// that not every filesystem tells from holes.
		if holes, err = findHoles(fd, from, to); err != nil {
			return fmt.Errorf("allocate %s: %w", file, err)
		}
	}
	err = fallocate(fd, 0, from, to-from)
	if err == nil && len(holes) > 0 {
		err = writeZeros(fd, file, holes)
	}
	if err != nil {
		if to > old {
			// Back to the old size, through a byte more: only a
			// truncate that shrinks the file is sure to free the
			// blocks past its end (one to the same size may keep
			// them). Blocks got below the old size stay, inside
			// the file, where they do no harm.
			_ = unix.Ftruncate(fd, old+1)
			_ = unix.Ftruncate(fd, old)
		}
		return fmt.Errorf("allocate %s [%d, %d): %w", file, from, to, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("allocate %s: %w", file, err)
	}
	return nil
}

// openWrite opens file for writing and returns its size.
func openWrite(file string) (fd int, size int64, err error) {
	fd, err = unix.Open(file, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, st.Size, nil
}

// zeroChunk is the size of each write of zeros.
const zeroChunk = 1 << 20

// findHoles returns the holes of fd in [from, to), the part past its end
// included, as [start, end) pairs.
func findHoles(fd int, from, to int64) ([][2]int64, error) {
	var holes [][2]int64
	for off := from; off < to; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			data = to // nothing but holes from off on
		} else if err != nil {
			return nil, fmt.Errorf("seek data at %d: %w", off, err)
		}
		if data = min(data, to); data > off {
			holes = append(holes, [2]int64{off, data})
		}
		if data == to {
			break
		}
		if off, err = unix.Seek(fd, data, unix.SEEK_HOLE); err != nil {
			return nil, fmt.Errorf("seek hole at %d: %w", data, err)
		}
	}
	return holes, nil
}

// writeZeros turns the allocated ranges of fd into written zeros:
// FALLOC_FL_WRITE_ZEROES where the kernel (6.17+) and the disk under the
// filesystem offer it (the disk zeroes, nothing crosses the bus), otherwise
// zeros written with direct I/O, so that the page cache is not filled with
// them (buffered where the filesystem refuses O_DIRECT).
func writeZeros(fd int, file string, ranges [][2]int64) error {
	switch err := fallocate(fd, unix.FALLOC_FL_WRITE_ZEROES, ranges[0][0], ranges[0][1]-ranges[0][0]); {
	case err == nil:
		for _, r := range ranges[1:] {
			if err := fallocate(fd, unix.FALLOC_FL_WRITE_ZEROES, r[0], r[1]-r[0]); err != nil {
				return fmt.Errorf("write zeroes at %d: %w", r[0], err)
			}
		}
		return nil
	case err != unix.EOPNOTSUPP && err != unix.EINVAL:
		return fmt.Errorf("write zeroes at %d: %w", ranges[0][0], err)
	}
	out := fd
	if dfd, err := unix.Open(file, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0); err == nil {
		defer unix.Close(dfd)
		out = dfd
	}
	// Anonymous memory is zeroed and page-aligned, as O_DIRECT needs.
	buf, err := unix.Mmap(-1, 0, zeroChunk, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("zero buffer: %w", err)
	}
	defer unix.Munmap(buf)
	for _, r := range ranges {
		for off := r[0]; off < r[1]; off += zeroChunk {
			if err := pwriteFull(out, buf[:min(zeroChunk, r[1]-off)], off); err != nil {
				return err
			}
		}
	}
	return nil
}

// fallocate retries EINTR, which a long allocation may see.
func fallocate(fd int, mode uint32, off, n int64) error {
	for {
		err := unix.Fallocate(fd, mode, off, n)
		if err != unix.EINTR {
			return err
		}
	}
}

// DataExtents returns the allocated ranges of f in [0, size) as
// [start, end) pairs, in order (SEEK_DATA and SEEK_HOLE): what a copy
// of f to another machine must send, holes left out.
func DataExtents(f *os.File, size int64) ([][2]int64, error) {
	fd := int(f.Fd())
	holes, err := findHoles(fd, 0, size)
	if err != nil {
		return nil, err
	}
	var data [][2]int64
	off := int64(0)
	for _, h := range holes {
		if h[0] > off {
			data = append(data, [2]int64{off, h[0]})
		}
		off = h[1]
	}
	if off < size {
		data = append(data, [2]int64{off, size})
	}
	return data, nil
}

// AllocatedBytes is the disk space f takes.
func AllocatedBytes(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return st.Blocks * 512, nil
}

// Dup returns a new descriptor of f's open file (close-on-exec), to be
// closed by its own owner: the way to share a file that has no name, such
// as an unlinked copy, between owners that each close theirs.
func Dup(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
