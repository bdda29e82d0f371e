package blockdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// makeFile creates file with size bytes: sparse (ftruncate) when src is "",
// otherwise a clone of src (see cloneFile) grown to size. The file and its
// directory entry are durable when it returns. A stale file left by an
// earlier failed attempt is replaced.
func makeFile(ctx context.Context, file, src string, size int64) error {
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
	if err := unix.Fsync(out); err != nil {
		return fmt.Errorf("sync %s: %w", file, err)
	}
	return atomicfile.SyncDir(filepath.Dir(file))
}

// growFile extends file to size bytes (never shrinks) and syncs it.
func growFile(file string, size int64) error {
	fd, err := unix.Open(file, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("grow %s: %w", file, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("grow %s: %w", file, err)
	}
	if st.Size < size {
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("grow %s: %w", file, err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("grow %s: %w", file, err)
	}
	return nil
}

// cloneFile fills the empty file out with src's contents. It first asks for
// a reflink (FICLONE: the files share extents, nothing is copied; xfs with
// reflink=1, btrfs). Filesystems that cannot reflink get a sparse-aware
// copy: only the data runs SEEK_DATA/SEEK_HOLE find are copied, so holes
// stay holes and the copy never allocates more than the source.
func cloneFile(ctx context.Context, out int, src string) error {
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(in)
	err = unix.IoctlFileClone(out, in)
	if err == nil || !cloneUnsupported(err) {
		return err
	}
	return sparseCopy(ctx, out, in)
}

// cloneUnsupported reports whether FICLONE failed because the filesystem
// cannot share extents between these files (as opposed to an I/O error).
func cloneUnsupported(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTTY, unix.EXDEV, unix.EINVAL, unix.ENOSYS, unix.EBADF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sparseCopy copies in's data runs into out at the same offsets.
func sparseCopy(ctx context.Context, out, in int) error {
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return fmt.Errorf("stat source: %w", err)
	}
	if err := unix.Ftruncate(out, st.Size); err != nil {
		return fmt.Errorf("size copy: %w", err)
	}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after off: the rest is a hole
		}
		if err != nil {
			return fmt.Errorf("seek data at %d: %w", off, err)
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		if err := copyRun(ctx, out, in, data, min(hole, st.Size)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyChunk bounds one copy_file_range call, so cancellation is noticed.
const copyChunk = 64 << 20

// copyRun copies bytes [from, to) with copy_file_range, falling back to
// read/write (which skips zero blocks) where the kernel refuses it.
func copyRun(ctx context.Context, out, in int, from, to int64) error {
	for from < to {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		roff, woff := from, from
		n, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(to-from, copyChunk)), 0)
		if err != nil && cloneUnsupported(err) {
			return rwCopy(ctx, out, in, from, to)
		}
		if err != nil {
			return fmt.Errorf("copy range at %d: %w", from, err)
		}
		if n == 0 {
			return fmt.Errorf("copy range at %d: source ended early: %w", from, unix.EIO)
		}
		from += int64(n)
	}
	return nil
}

// rwCopy copies [from, to) with pread/pwrite, leaving all-zero blocks as
// holes in out.
func rwCopy(ctx context.Context, out, in int, from, to int64) error {
	buf := make([]byte, 1<<20)
	for from < to {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		n, err := unix.Pread(in, buf[:min(to-from, int64(len(buf)))], from)
		if err != nil {
			return fmt.Errorf("read at %d: %w", from, err)
		}
		if n == 0 {
			return fmt.Errorf("read at %d: source ended early: %w", from, unix.EIO)
		}
		if err := writeNonZero(out, buf[:n], from); err != nil {
			return err
		}
		from += int64(n)
	}
	return nil
}

// writeNonZero writes p at off in SizeAlign blocks, skipping all-zero ones.
func writeNonZero(out int, p []byte, off int64) error {
	for len(p) > 0 {
		b := p[:min(len(p), SizeAlign)]
		if !allZero(b) {
			if _, err := unix.Pwrite(out, b, off); err != nil {
				return fmt.Errorf("write at %d: %w", off, err)
			}
		}
		p, off = p[len(b):], off+int64(len(b))
	}
	return nil
}

func allZero(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}
