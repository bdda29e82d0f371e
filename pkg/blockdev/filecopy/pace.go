package filecopy

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// Pacer paces a copy: Wait returns when the copy may move its next n
// bytes, or ctx's error.
type Pacer interface {
	Wait(ctx context.Context, n int) error
}

// Expecter is a Pacer told, before a copy starts, the most bytes it will
// move (so that it can see the copy done by a deadline).
type Expecter interface {
	Expect(n int64)
}

type pacerKey struct{}

// WithPacer returns ctx carrying p, which then paces the copies CopyFile and
// MakeFile make under ctx: the caller knows whether a copy is a background
// one and how it is paced, the store between them does not. ResyncFile is
// never paced: its source is held steady meanwhile and must be let go soon.
func WithPacer(ctx context.Context, p Pacer) context.Context {
	return context.WithValue(ctx, pacerKey{}, p)
}

// pacerOf returns the Pacer ctx carries, or nil.
func pacerOf(ctx context.Context) Pacer {
	p, _ := ctx.Value(pacerKey{}).(Pacer)
	return p
}

// writeBehindLag is how much of what a paced copy wrote may wait for the
// disk: beyond it the copy waits for its oldest writes.
const writeBehindLag = 8 << 20

// paced is a copy under a Pacer: before each chunk it asks the Pacer, and
// after it starts the chunk's writeback, so that the copy's writes reach
// the disk at its pace rather than all at once when it is synced (a burst
// no Pacer sees), and leaves the page cache to others. A nil *paced paces
// nothing.
type paced struct {
	p       Pacer
	out     int
	pending [][2]int64 // written, writeback started: [offset, length]
	lag     int64      // their bytes
}

// pacingOf returns the pacing of a copy into out under ctx, nil without a
// Pacer.
func pacingOf(ctx context.Context, out int) *paced {
	if p := pacerOf(ctx); p != nil {
		return &paced{p: p, out: out}
	}
	return nil
}

// before waits until the copy may move n bytes.
func (pc *paced) before(ctx context.Context, n int) error {
	if pc == nil {
		return nil
	}
	if err := pc.p.Wait(ctx, n); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return nil
}

// wrote starts the writeback of the n bytes written at off, and waits for
// the oldest writes beyond writeBehindLag, which then leave the page cache.
// sync_file_range only hastens what the copy's sync does anyway, which
// reports any error, so its own are ignored.
func (pc *paced) wrote(off int64, n int) {
	if pc == nil || n <= 0 {
		return
	}
	_ = unix.SyncFileRange(pc.out, off, int64(n), unix.SYNC_FILE_RANGE_WRITE)
	pc.pending = append(pc.pending, [2]int64{off, int64(n)})
	for pc.lag += int64(n); pc.lag > writeBehindLag; pc.pending = pc.pending[1:] {
		r := pc.pending[0]
		_ = unix.SyncFileRange(pc.out, r[0], r[1], unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		_ = unix.Fadvise(pc.out, r[0], r[1], unix.FADV_DONTNEED)
		pc.lag -= r[1]
	}
}
