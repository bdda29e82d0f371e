package filecopy

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

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

// CanReflink reports whether the filesystem holding dir shares extents
// between files (FICLONE), by cloning a temporary file in dir. A copy of a
// file there is then one reflink, made at a single point in time: the
// filesystem holds the file's writers out while it clones (xfs takes the
// inode's I/O lock exclusively, btrfs the inode lock).
func CanReflink(dir string) (bool, error) {
	a, err := os.CreateTemp(dir, atomicfile.TempPrefix+"reflink-probe-*")
	if err != nil {
		return false, fmt.Errorf("reflink probe: %w", err)
	}
	defer os.Remove(a.Name())
	defer a.Close()
	b, err := os.CreateTemp(dir, atomicfile.TempPrefix+"reflink-probe-*")
	if err != nil {
		return false, fmt.Errorf("reflink probe: %w", err)
	}
	defer os.Remove(b.Name())
	defer b.Close()
	if _, err := a.Write(make([]byte, blockdev.SizeAlign)); err != nil {
		return false, fmt.Errorf("reflink probe: %w", err)
	}
	err = unix.IoctlFileClone(int(b.Fd()), int(a.Fd()))
	if err != nil && cloneUnsupported(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reflink probe: %w", err)
	}
	return true, nil
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
	if e, ok := pacerOf(ctx).(Expecter); ok {
		e.Expect(st.Blocks * 512) // the data runs take at most its blocks
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

// copyChunk bounds one copy_file_range call, so cancellation is noticed;
// pacedChunk bounds it under a Pacer, so that the pace is smooth.
const (
	copyChunk  = 64 << 20
	pacedChunk = 1 << 20
)

// copyRun copies bytes [from, to) with copy_file_range, falling back to
// read/write (which skips zero blocks) where the kernel refuses it.
func copyRun(ctx context.Context, out, in int, from, to int64) error {
	pace, chunk := pacingOf(ctx, out), int64(copyChunk)
	if pace != nil {
		chunk = pacedChunk
	}
	for from < to {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		n := int(min(to-from, chunk))
		if err := pace.before(ctx, n); err != nil {
			return err
		}
		roff, woff := from, from
		n, err := unix.CopyFileRange(in, &roff, out, &woff, n, 0)
		if err != nil && cloneUnsupported(err) {
			return rwCopy(ctx, out, in, from, to)
		}
		if err != nil {
			return fmt.Errorf("copy range at %d: %w", from, err)
		}
		if n == 0 {
			return fmt.Errorf("copy range at %d: source ended early: %w", from, unix.EIO)
		}
		pace.wrote(from, n)
		from += int64(n)
	}
	return nil
}

// rwCopy copies [from, to) with pread/pwrite, leaving all-zero blocks as
// holes in out.
func rwCopy(ctx context.Context, out, in int, from, to int64) error {
	pace := pacingOf(ctx, out)
	buf := make([]byte, pacedChunk)
	for from < to {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		n := int(min(to-from, int64(len(buf))))
		if err := pace.before(ctx, n); err != nil {
			return err
		}
		n, err := unix.Pread(in, buf[:n], from)
		if err != nil {
			return fmt.Errorf("read at %d: %w", from, err)
		}
		if n == 0 {
			return fmt.Errorf("read at %d: source ended early: %w", from, unix.EIO)
		}
		if err := writeNonZero(out, buf[:n], from); err != nil {
			return err
		}
		pace.wrote(from, n)
		from += int64(n)
	}
	return nil
}

// writeNonZero writes p at off in SizeAlign blocks, skipping all-zero ones.
func writeNonZero(out int, p []byte, off int64) error {
	for len(p) > 0 {
		b := p[:min(len(p), blockdev.SizeAlign)]
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

func preadFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pread(fd, p, off)
		if err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		if n == 0 {
			return fmt.Errorf("read at %d: file ended early: %w", off, unix.EIO)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

func pwriteFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}
