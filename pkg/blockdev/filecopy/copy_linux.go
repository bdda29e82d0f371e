package filecopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
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

// ResyncFile makes file, an earlier copy of src at least as large, hold
// src's current content again: a reflink where the filesystem shares
// extents, otherwise syncCopy, which writes only the blocks that differ.
// The caller holds src steady, and syncs file (SyncFile) after it has let
// src go: the content is fixed once ResyncFile returns, and a sync inside
// the hold would only lengthen it.
func ResyncFile(ctx context.Context, file, src string) error {
	out, err := unix.Open(file, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", file, err)
	}
	defer unix.Close(out)
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(in)
	err = unix.IoctlFileClone(out, in)
	if err != nil && cloneUnsupported(err) {
		err = syncCopy(ctx, out, in)
	}
	if err != nil {
		return fmt.Errorf("update %s from %s: %w", file, src, err)
	}
	return nil
}

// syncCopy makes out, a copy of in made earlier (as large or larger), equal
// to in over in's size, writing only where they differ: in's data runs are
// compared block by block with out, and holes in is punched where out has
// data. Blocks of zeros in the source become holes in out.
func syncCopy(ctx context.Context, out, in int) error {
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return fmt.Errorf("stat source: %w", err)
	}
	sc := syncer{out: out, in: in, src: make([]byte, syncChunk), dst: make([]byte, syncChunk)}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = st.Size // no data after off
		} else if err != nil {
			return fmt.Errorf("seek data at %d: %w", off, err)
		}
		if err := sc.clearHole(off, min(data, st.Size)); err != nil {
			return err
		}
		if data >= st.Size {
			return nil
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		hole = min(hole, st.Size)
		if err := sc.syncRun(ctx, data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// syncChunk is how much of each file syncCopy compares at a time.
const syncChunk = 1 << 20

// syncer holds syncCopy's files and buffers.
type syncer struct {
	out, in  int
	src, dst []byte
}

// clearHole makes [from, to) of out, a hole in the source, a hole too, if
// out has any data there.
func (sc *syncer) clearHole(from, to int64) error {
	if from >= to {
		return nil
	}
	data, err := unix.Seek(sc.out, from, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) || err == nil && data >= to {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seek data in copy at %d: %w", from, err)
	}
	return sc.zero(data, to-data)
}

// syncRun makes [from, to) of out equal to the source's.
func (sc *syncer) syncRun(ctx context.Context, from, to int64) error {
	for from < to {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		n := int(min(to-from, syncChunk))
		src, dst := sc.src[:n], sc.dst[:n]
		if err := preadFull(sc.in, src, from); err != nil {
			return err
		}
		if err := preadFull(sc.out, dst, from); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		if err := sc.rewrite(src, dst, from); err != nil {
			return err
		}
		from += int64(n)
	}
	return nil
}

// rewrite writes the SizeAlign blocks of src that differ from dst at off,
// punching those that are all zeros; neighbours of one kind go in one call.
func (sc *syncer) rewrite(src, dst []byte, off int64) error {
	for i := 0; i < len(src); {
		j := min(i+blockdev.SizeAlign, len(src))
		if bytes.Equal(src[i:j], dst[i:j]) {
			i = j
			continue
		}
		zero := allZero(src[i:j])
		for j < len(src) {
			k := min(j+blockdev.SizeAlign, len(src))
			if bytes.Equal(src[j:k], dst[j:k]) || allZero(src[j:k]) != zero {
				break
			}
			j = k
		}
		var err error
		if zero {
			err = sc.zero(off+int64(i), int64(j-i))
		} else {
			err = pwriteFull(sc.out, src[i:j], off+int64(i))
		}
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}

// zero makes [off, off+n) of out read as zeros, as a hole where the
// filesystem can punch one.
func (sc *syncer) zero(off, n int64) error {
	err := unix.Fallocate(sc.out, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil || !errors.Is(err, unix.EOPNOTSUPP) {
		if err != nil {
			return fmt.Errorf("punch copy at %d: %w", off, err)
		}
		return nil
	}
	zeros := make([]byte, min(n, syncChunk))
	for n > 0 {
		m := min(n, int64(len(zeros)))
		if err := pwriteFull(sc.out, zeros[:m], off); err != nil {
			return err
		}
		off, n = off+m, n-m
	}
	return nil
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
