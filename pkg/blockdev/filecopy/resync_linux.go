package filecopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

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
