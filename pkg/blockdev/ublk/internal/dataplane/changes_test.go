package dataplane

import (
	"math"
	"slices"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

const gran = cbt.Granularity

// TestQueueRecordsChanges serves every kind of request on a host queue
// (a real ring over a scratch file) and checks which ranges its change
// bitmap recorded: writes, discards and write-zeroes, not reads or
// flushes. No subtests: the ring is registered to this test's thread.
func TestQueueRecordsChanges(t *testing.T) {
	l, f := hostLoop(t, 2, TargetFile)
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	bm, err := cbt.NewBitmap(32 << 20) // smaller than the file: a device grown since
	if err != nil {
		t.Fatal(err)
	}
	l.cfg.Changes = bm
	for _, c := range []struct {
		name    string
		opFlags uint32
		sectors uint32
		start   uint64
		want    []cbt.Extent
	}{
		{"read", uapi.IOOpRead, 8, 0, nil},
		{"flush", uapi.IOOpFlush, 0, 0, nil},
		{"write", uapi.IOOpWrite, 8, gran >> 9, []cbt.Extent{{Offset: gran, Length: gran}}},
		{"write across chunks", uapi.IOOpWrite, 16, (3*gran - 4096) >> 9, []cbt.Extent{{Offset: 2 * gran, Length: 2 * gran}}},
		{"fua write", uapi.IOOpWrite | uapi.IOFlagFUA, 8, 0, []cbt.Extent{{Offset: 0, Length: gran}}},
		{"discard", uapi.IOOpDiscard, 4 << 20 >> 9, 8 << 20 >> 9, []cbt.Extent{{Offset: 8 << 20, Length: 4 << 20}}},
		{"write zeroes", uapi.IOOpWriteZeroes, 8, 20 << 20 >> 9, []cbt.Extent{{Offset: 20 << 20, Length: gran}}},
		{"write zeroes nounmap", uapi.IOOpWriteZeroes | uapi.IOFlagNoUnmap, 8, 21 << 20 >> 9, []cbt.Extent{{Offset: 21 << 20, Length: gran}}},
		{"write past the bitmap", uapi.IOOpWrite, 8, 40 << 20 >> 9, []cbt.Extent{{Offset: 32 << 20, Length: math.MaxInt64 - 32<<20}}},
	} {
		setDesc(l, 0, c.opFlags, c.sectors, c.start)
		serveOne(t, l, 0)
		if got := bm.Cut(); !slices.Equal(got, c.want) {
			t.Fatalf("%s: recorded %v, want %v", c.name, got, c.want)
		}
	}
}

func TestTrackedDispatchAllocs(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	l.cfg.Changes, _ = cbt.NewBitmap(1 << 20)
	setDesc(l, 0, uapi.IOOpWrite, 8, 0)
	serveOne(t, l, 0)
	if n := testing.AllocsPerRun(200, func() { serveOne(t, l, 0) }); n != 0 {
		t.Fatalf("%v allocations per tracked write", n)
	}
}

// BenchmarkLoopDispatchWrite and BenchmarkLoopDispatchWriteTracked serve
// 4 KiB writes into a page-cache file through the whole per-request path,
// without and with a change bitmap: the difference is the per-request cost
// of tracking. (Two benchmarks, not sub-benchmarks: the ring is registered
// to the benchmark's own thread.)
func BenchmarkLoopDispatchWrite(b *testing.B) { benchDispatchWrite(b, false) }

func BenchmarkLoopDispatchWriteTracked(b *testing.B) { benchDispatchWrite(b, true) }

func benchDispatchWrite(b *testing.B, tracked bool) {
	l, _ := hostLoop(b, 2, TargetFile)
	if tracked {
		l.cfg.Changes, _ = cbt.NewBitmap(1 << 20)
	}
	setDesc(l, 0, uapi.IOOpWrite, 8, 0)
	b.ReportAllocs()
	for b.Loop() {
		serveOne(b, l, 0)
	}
}
