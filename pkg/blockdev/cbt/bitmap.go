package cbt

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
)

// Granularity is the size of the chunks a Bitmap records, in bytes, on
// volumes up to maxChunks of them (512 GiB): a request that touches any
// byte of a chunk marks all of it. 64 KiB keeps a bitmap at 2 KiB per GiB
// of volume per queue, and a delta names at most the 64 KiB around each
// write (costs measured in docs/benchmarks.md, "Changed-block tracking").
// Larger volumes get chunks of the next powers of two, so that no bitmap
// exceeds 1 MiB per queue.
const Granularity = 64 << 10

const (
	granShift = 16      // log2(Granularity)
	maxChunks = 1 << 23 // bits of the largest bitmap: 1 MiB
)

// Bitmap records which chunks of a device were written. One queue's server
// thread marks it (Mark); the control side reads and clears it (Cut).
//
// Words are read and written with sync/atomic so that a Cut never loses a
// mark made at the same time: a mark lands either in the cut or in the
// bitmap after it. Mark first loads the word and writes only when a bit is
// missing, so a write into a chunk already marked since the last cut costs
// one plain load (sync/atomic loads are plain loads on amd64 and arm64);
// the read-modify-write (a locked OR) is paid once per chunk per snapshot.
type Bitmap struct {
	words []atomic.Uint64
	size  int64 // bytes covered
	shift uint  // log2 of the chunk size
	// beyond is set by a mark that reached past size (a device grown
	// after the bitmap was made): everything from size on is changed.
	beyond atomic.Bool
}

// NewBitmap returns an empty bitmap of a device of size bytes.
func NewBitmap(size int64) (*Bitmap, error) {
	if size < 0 {
		return nil, fmt.Errorf("bitmap of %d bytes: negative size", size)
	}
	shift := uint(granShift)
	for (size-1)>>shift >= maxChunks {
		shift++
	}
	chunks := (size + 1<<shift - 1) >> shift
	return &Bitmap{words: make([]atomic.Uint64, (chunks+63)/64), size: size, shift: shift}, nil
}

// Size is how many bytes of the device the bitmap covers.
func (b *Bitmap) Size() int64 { return b.size }

// Granularity is the size of the bitmap's chunks: Granularity, or more for
// a device of over 512 GiB.
func (b *Bitmap) Granularity() int64 { return 1 << b.shift }

// Mark records that the request [off, off+n) changed the device. It is
// safe for concurrent use with Mark and Cut, does not allocate, and
// ignores n <= 0 and negative offsets (the data plane decodes neither).
func (b *Bitmap) Mark(off, n int64) {
	if n <= 0 || off < 0 {
		return
	}
	end := off + n
	if n > math.MaxInt64-off || end > b.size {
		b.beyond.Store(true)
		end = b.size
		if off >= end {
			return
		}
	}
	first, last := off>>b.shift, (end-1)>>b.shift
	for w := first >> 6; w <= last>>6; w++ {
		lo, hi := max(first, w<<6)-w<<6, min(last, w<<6+63)-w<<6
		mask := (^uint64(0) >> (63 - (hi - lo))) << lo
		word := &b.words[w]
		if word.Load()&mask != mask {
			word.Or(mask)
		}
	}
}

// Cut returns the extents marked since the last Cut, normalized, and
// clears them: marks made during the Cut land either in its answer or in
// the bitmap for the next one. A mark past the bitmap's size makes the
// answer end with [size, math.MaxInt64). Safe for concurrent use with
// Mark; Cuts of one bitmap must not overlap each other.
func (b *Bitmap) Cut() []Extent {
	var out []Extent
	for w := range b.words {
		word := b.words[w].Swap(0)
		for word != 0 {
			lo := bits.TrailingZeros64(word)
			run := bits.TrailingZeros64(^(word >> lo))
			if run == 64 {
				word = 0
			} else {
				word &^= (uint64(1)<<run - 1) << lo
			}
			off := (int64(w)<<6 + int64(lo)) << b.shift
			out = append(out, Extent{Offset: off, Length: min(int64(run)<<b.shift, b.size-off)})
		}
	}
	if b.beyond.Swap(false) {
		out = append(out, Extent{Offset: b.size, Length: math.MaxInt64 - b.size})
	}
	return Normalize(out)
}
