package uring

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestBufRingSelect proves the provided-buffer ring against the kernel:
// reads sent with IOSQE_BUFFER_SELECT land in the ring's buffers in the
// order they were provided, each CQE names its buffer, an empty ring
// refuses the read with -ENOBUFS, and a recycled buffer (here entry 0,
// whose id shares a word with the tail) is picked again.
func TestBufRingSelect(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 8, Flags: QueueFlags})
	br, err := r.RegisterBufRing(3, 2, 64)
	if err != nil {
		// A kernel before 5.19 does not know the register opcode
		// (EINVAL); on a later one EINVAL is a bug in the request.
		if errors.Is(err, unix.EINVAL) && kernelBefore(5, 19) {
			testgate.Skip(t, testgate.BufRing, "kernel without provided-buffer rings: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := br.Close(); err != nil {
			t.Error(err)
		}
	})
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close(); pw.Close() })

	read := func(msg string) CQE {
		t.Helper()
		if msg != "" {
			if _, err := pw.WriteString(msg); err != nil {
				t.Fatal(err)
			}
		}
		s := r.GetSQE()
		s.PrepRW(IORING_OP_READ, int32(pr.Fd()), 0, 64, ^uint64(0))
		s.Flags |= IOSQE_BUFFER_SELECT
		s.BufIndex = br.Group()
		return waitOne(t, r)
	}
	check := func(c CQE, wantID uint16, want string) {
		t.Helper()
		id, ok := BufferID(&c)
		if !ok || c.Res != int32(len(want)) || id != wantID {
			t.Fatalf("cqe res %d flags %#x: want %d bytes in buffer %d", c.Res, c.Flags, len(want), wantID)
		}
		if got := string(br.Buf(id)[:c.Res]); got != want {
			t.Fatalf("buffer %d holds %q, want %q", id, got, want)
		}
	}
	check(read("first"), 0, "first")
	check(read("second"), 1, "second")
	if c := read("third"); c.Res != -int32(unix.ENOBUFS) {
		t.Fatalf("read from an empty ring: res %d, want -ENOBUFS", c.Res)
	}
	br.Recycle(0)
	check(read(""), 0, "third")
	br.Recycle(1)
	br.Recycle(0)
	check(read("fourth"), 1, "fourth")
	check(read("fifth"), 0, "fifth")
}

func TestBufRingRejectsBadShape(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4})
	for _, c := range []struct{ entries, size int }{{3, 64}, {0, 64}, {4, 0}, {1 << 16, 64}} {
		if _, err := r.RegisterBufRing(1, c.entries, c.size); !errors.Is(err, unix.EINVAL) {
			t.Errorf("RegisterBufRing(%d, %d): %v, want EINVAL", c.entries, c.size, err)
		}
	}
}

// kernelBefore reports whether the running kernel's release is older than
// major.minor.
func kernelBefore(major, minor int) bool {
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return false
	}
	var maj, min int
	fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &maj, &min)
	return maj < major || maj == major && min < minor
}
