package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
)

// writtenBytes is this process's write_bytes from /proc/self/io: the bytes
// it caused to be written to storage (counted when a page is dirtied).
func writtenBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		testgate.Skip(t, testgate.IOAcct, "no I/O accounting: %v", err)
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
	testgate.Skip(t, testgate.IOAcct, "no write_bytes in /proc/self/io")
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
	testgate.RequireRoot(t)
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	lv := mountVolume(t, s, "big", 256<<20)
	const data, change = 192 << 20, 1 << 20
	for i := range data / (16 << 20) {
		file := filepath.Join(lv.mnt, "data"+strconv.Itoa(i))
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		testfs.WriteAt(t, file, 0, 16<<20, byte(i))
	}
	late := bytes.Repeat([]byte("written after the snapshot began\n"), change/32)
	var frozenWrites int64
	var frozen time.Duration
	q := func(ctx context.Context) (func() error, error) {
		// The pod writes while the snapshot is under way.
		if err := os.WriteFile(filepath.Join(lv.mnt, "late"), late, 0o600); err != nil {
			return nil, err
		}
		thaw, err := quiesce.FreezeVolume(ctx, s.Dir(), lv.v.ID, lv.mnt, lv.dev)
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
	testfs.Run(t, "e2fsck", "-fn", file)
	ro := mountImageRO(t, file)
	if got, err := os.ReadFile(filepath.Join(ro, "late")); err != nil || !bytes.Equal(got, late) {
		t.Fatalf("snapshot lacks the write made before the freeze (%d bytes, %v)", len(got), err)
	}
}
