package blockdev

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// writtenBytes is this process's write_bytes from /proc/self/io: the bytes
// it caused to be written to storage (counted when a page is dirtied).
func writtenBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no I/O accounting: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no write_bytes in /proc/self/io")
	return 0
}

// TestFrozenWindowCopiesOnlyChanges snapshots a mounted volume holding
// 192 MiB of data on a data directory without reflink (ext4), while a
// "pod" writes 1 MiB into it after the snapshot started. The volume's
// filesystem must be frozen only while the copy catches up with what
// changed: the bytes written while frozen are bounded by the change, not
// by the volume's data, and the snapshot still holds the late write and
// is a clean filesystem.
func TestFrozenWindowCopiesOnlyChanges(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	lv := mountVolume(t, s, "big", 256<<20)
	const data, change = 192 << 20, 1 << 20
	for i := range data / (16 << 20) {
		file := filepath.Join(lv.mnt, "data"+strconv.Itoa(i))
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		writeAt(t, file, 0, 16<<20, byte(i))
	}
	late := bytes.Repeat([]byte("written after the snapshot began\n"), change/32)
	var frozenWrites int64
	var frozen time.Duration
	q := func(ctx context.Context) (func() error, error) {
		// The pod writes while the snapshot is under way.
		if err := os.WriteFile(filepath.Join(lv.mnt, "late"), late, 0o600); err != nil {
			return nil, err
		}
		thaw, err := s.FreezeFS(ctx, lv.v.ID, lv.mnt, lv.dev)
		if err != nil {
			return nil, err
		}
		start, w0 := time.Now(), writtenBytes(t)
		return func() error {
			frozenWrites, frozen = writtenBytes(t)-w0, time.Since(start)
			return thaw()
		}, nil
	}
	snap, err := s.CreateSnapshot(ctx, "big-snap", lv.v.ID, q)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("frozen for %v, %d bytes written while frozen (volume data %d, change %d)", frozen, frozenWrites, data, change)
	if frozenWrites > 8*change {
		t.Errorf("%d bytes written while frozen for a %d-byte change: the frozen pass copies the whole volume (%d data bytes), not what changed",
			frozenWrites, change, data)
	}
	if frozenWrites < change {
		t.Errorf("%d bytes written while frozen, less than the %d-byte change made after the first pass", frozenWrites, change)
	}
	file := s.dataFile(snap.ID)
	run(t, "e2fsck", "-fn", file)
	ro := mountImageRO(t, file)
	if got, err := os.ReadFile(filepath.Join(ro, "late")); err != nil || !bytes.Equal(got, late) {
		t.Fatalf("snapshot lacks the write made before the freeze (%d bytes, %v)", len(got), err)
	}
}

// TestSyncCopy proves the catch-up pass makes a stale copy equal to its
// source for every kind of change (a rewritten block, new data in a hole, a
// punched range, a block zeroed by a write) and keeps holes holes.
func TestSyncCopy(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, 16<<20); err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, 0, 4<<20, 1)
	writeAt(t, src, 8<<20, 2<<20, 2)
	if err := makeFile(context.Background(), dst, src, 16<<20); err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, 4096, 4096, 7)   // a block rewritten
	writeAt(t, src, 12<<20, 8192, 9) // data where there was a hole
	f, err := os.OpenFile(src, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4096), 2<<20); err != nil { // a block zeroed
		t.Fatal(err)
	}
	// a discard: the second data run becomes a hole
	if err := unixPunch(f, 8<<20, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := resyncFile(context.Background(), dst, src); err != nil {
		t.Fatal(err)
	}
	samePrefix(t, src, dst)
	if a, b := allocated(t, dst), allocated(t, src); a > b {
		t.Errorf("copy allocates %d bytes, source %d: holes were filled", a, b)
	}
}

func unixPunch(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}
