package cbt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// BlockSize is the unit of Compare: the volumes' block size (blockdev's
// SizeAlign), so that a delta names whole blocks.
const BlockSize = 4096

// compareBuf is how much of each file Compare reads at once.
const compareBuf = 1 << 20

// Allocated returns the extents of the file at path that hold data, from
// the filesystem's extent map (SEEK_DATA and SEEK_HOLE), without reading
// any, clipped to size, and the file's size. Holes and unwritten
// (preallocated, never written) extents read as zeros and are left out;
// filesystems without SEEK_DATA report the whole file as data.
func Allocated(ctx context.Context, path string, size int64) ([]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allocated extents: %w", err)
	}
	defer f.Close()
	exts, err := dataRuns(ctx, f, 0, size)
	if err != nil {
		return nil, fmt.Errorf("allocated extents of %s: %w", path, err)
	}
	return exts, nil
}

// dataRuns returns the data runs of f in [from, to).
func dataRuns(ctx context.Context, f *os.File, from, to int64) ([]Extent, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var out []Extent
	var serr error
	err = rc.Control(func(fd uintptr) {
		for off := from; off < to; {
			if serr = ctx.Err(); serr != nil {
				return
			}
			data, err := unix.Seek(int(fd), off, unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) {
				return // only a hole from off to the end of the file
			}
			if err != nil {
				serr = fmt.Errorf("seek data at %d: %w", off, err)
				return
			}
			if data >= to {
				return
			}
			hole, err := unix.Seek(int(fd), data, unix.SEEK_HOLE)
			if err != nil {
				serr = fmt.Errorf("seek hole at %d: %w", data, err)
				return
			}
			hole = min(hole, to)
			out = append(out, Extent{Offset: data, Length: hole - data})
			off = hole
		}
	})
	if err == nil {
		err = serr
	}
	return out, err
}

// Compare returns the BlockSize blocks of [0, size) whose content differs
// between the files at a and b, normalized. Bytes past a file's end read
// as zeros, and ranges that are holes in both files are skipped without
// reading; everything else is read from both and compared. ctx is checked
// between reads.
func Compare(ctx context.Context, a, b string, size int64) ([]Extent, error) {
	fa, err := os.Open(a)
	if err != nil {
		return nil, fmt.Errorf("compare: %w", err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return nil, fmt.Errorf("compare: %w", err)
	}
	defer fb.Close()
	ra, err := dataRuns(ctx, fa, 0, size)
	if err != nil {
		return nil, fmt.Errorf("compare %s: %w", a, err)
	}
	rb, err := dataRuns(ctx, fb, 0, size)
	if err != nil {
		return nil, fmt.Errorf("compare %s: %w", b, err)
	}
	bufA, bufB := make([]byte, compareBuf), make([]byte, compareBuf)
	var out []Extent
	for _, r := range Union(ra, rb) {
		// Whole blocks: a run may start or end inside one.
		start := r.Offset / BlockSize * BlockSize
		end := min((r.End()+BlockSize-1)/BlockSize*BlockSize, size)
		for off := start; off < end; off += compareBuf {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("compare %s and %s: %w", a, b, err)
			}
			n := min(int64(compareBuf), end-off)
			if err := readZero(fa, bufA[:n], off); err != nil {
				return nil, fmt.Errorf("compare: read %s: %w", a, err)
			}
			if err := readZero(fb, bufB[:n], off); err != nil {
				return nil, fmt.Errorf("compare: read %s: %w", b, err)
			}
			out = appendDiff(out, bufA[:n], bufB[:n], off)
		}
	}
	return Normalize(out), nil
}

// readZero fills buf from f at off; what lies past the end of f reads as
// zeros.
func readZero(f *os.File, buf []byte, off int64) error {
	n, err := f.ReadAt(buf, off)
	if errors.Is(err, io.EOF) {
		clear(buf[n:])
		return nil
	}
	return err
}

// appendDiff appends the BlockSize blocks in which x and y (read at off)
// differ.
func appendDiff(out []Extent, x, y []byte, off int64) []Extent {
	for i := 0; i < len(x); i += BlockSize {
		j := min(i+BlockSize, len(x))
		if bytes.Equal(x[i:j], y[i:j]) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End() == off+int64(i) {
			out[n-1].Length += int64(j - i)
		} else {
			out = append(out, Extent{Offset: off + int64(i), Length: int64(j - i)})
		}
	}
	return out
}
