package dataplane

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// resident counts the resident pages of b.
func resident(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+unix.Getpagesize()-1)/unix.Getpagesize())
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestLoopReclaimsIdleTails proves that a copy-mode queue which served
// requests larger than the registered head gives the pages past the head
// back once idle, keeps the registered heads, and serves large and small
// requests correctly afterwards.
func TestLoopReclaimsIdleTails(t *testing.T) {
	l, f := hostLoop(t, 4, TargetFile, true)
	l.cfg.Options.IdleReclaim = time.Hour
	small := bytes.Repeat([]byte("head only"), 8<<10/9+1)[:8<<10]
	roundTrip(t, l, f, small, 8, 0)
	if l.tailsUsed {
		t.Fatal("an 8 KiB request within the registered head marked the tails used")
	}
	big := bytes.Repeat([]byte("big request, past the head"), 64<<10/26+1)[:64<<10]
	roundTrip(t, l, f, big, 64, 0)
	tail := func(tag uint16) []byte { return l.bufs.slice(tag)[FixedHeadBytes:] }
	if !l.tailsUsed || resident(t, tail(1)) == 0 || resident(t, tail(2)) == 0 {
		t.Fatalf("after a 64 KiB write and read: tails used %v, resident tail pages %d and %d",
			l.tailsUsed, resident(t, tail(1)), resident(t, tail(2)))
	}
	if l.reclaimDue(monoNow()) {
		t.Fatal("reclaim due right after the last request")
	}
	if w := l.reclaimWait(monoNow()); w <= 0 || w > time.Hour {
		t.Fatalf("reclaimWait = %v, want a bound of at most an hour", w)
	}
	idle := l.tailsAt + int64(time.Hour)
	if !l.reclaimDue(idle) {
		t.Fatal("reclaim not due after an idle hour")
	}
	l.reclaim()
	// The head keeps what the 8 KiB requests registered; the rest of the
	// buffer, the unregistered part of the head included, is given back.
	reg := int(l.tags[1].reg)
	heads, rest := resident(t, l.bufs.slice(1)[:reg]), resident(t, l.bufs.slice(1)[reg:])
	if resident(t, tail(1)) != 0 || resident(t, tail(2)) != 0 || reg != 8<<10 || heads != reg/unix.Getpagesize() || rest != 0 {
		t.Fatalf("after reclaim: %d and %d tail pages resident (want 0), %d of %d registered head pages (want all), %d pages past them",
			resident(t, tail(1)), resident(t, tail(2)), heads, reg/unix.Getpagesize(), rest)
	}
	if l.tailsUsed || l.reclaimWait(idle) != 0 || l.statsNow().Reclaims != 1 {
		t.Fatalf("after reclaim: tails used %v, wait bound %v, reclaims %d", l.tailsUsed, l.reclaimWait(idle), l.statsNow().Reclaims)
	}
	// The reclaimed pages fault in again, and the registered heads still
	// reach the same memory as the buffers.
	roundTrip(t, l, f, bytes.Repeat([]byte{0xa5}, 64<<10), 256, 0)
	roundTrip(t, l, f, bytes.Repeat([]byte{0x3c}, 8<<10), 512, 0)
}

// TestLoopReclaimWaitsForIdle proves that reclaim never runs while a
// request is in flight, nor when it is turned off.
func TestLoopReclaimWaitsForIdle(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile, true)
	l.cfg.Options.IdleReclaim = time.Millisecond
	setDesc(l, 0, uapi.IOOpRead, 64<<10>>9, 0)
	if err := l.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	later := l.tailsAt + int64(time.Hour)
	if l.reclaimDue(later) || l.reclaimWait(later) != 0 {
		t.Fatal("reclaim due, or the wait bounded, with a request in flight")
	}
	settle(t, l, 1)
	if !l.reclaimDue(later) {
		t.Fatal("reclaim not due once the request was committed")
	}
	l.cfg.Options.IdleReclaim = 0
	if l.reclaimDue(later) || l.reclaimWait(later) != 0 {
		t.Fatal("IdleReclaim 0 still reclaims")
	}
	// Without DEFER_TASKRUN the kernel may copy a new WRITE into a buffer
	// between two madvise calls: such a ring never reclaims, and so must
	// never bound its waits for a reclaim (it would wake every
	// millisecond for good).
	l.cfg.Options.IdleReclaim = time.Millisecond
	plain, err := uring.New(uring.Config{Entries: 4})
	if err != nil {
		t.Fatal(err)
	}
	deferred := l.ring
	l.ring = plain
	due, wait := l.reclaimDue(later), l.reclaimWait(later)
	l.ring = deferred
	plain.Close()
	if due || wait != 0 {
		t.Fatalf("ring without DEFER_TASKRUN: reclaim due %v, wait bound %v; want neither", due, wait)
	}
}

// settle runs the loop's backing I/O until n requests have been committed.
func settle(t *testing.T, l *queueState, n int) {
	t.Helper()
	cmds := make([]int32, 0, n)
	for len(cmds) < n {
		cmds = step(t, l, cmds)
	}
}
