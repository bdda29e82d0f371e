package store

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// BenchmarkDelta measures a delta between two snapshots of a volume full
// of data with 1% of its 64 KiB chunks changed (one 4 KiB write each),
// side by side: from the change records, by comparing the two files, and
// reading the whole target (what a backup without a delta does); the
// files' pages are dropped from the cache before each. The volume is
// FASTBLK_DELTA_BENCH_SIZE bytes (default 1 GiB); docs/benchmarks.md has
// the figures.
func BenchmarkDelta(b *testing.B) {
	size := int64(1 << 30)
	if v := os.Getenv("FASTBLK_DELTA_BENCH_SIZE"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		size = n
	}
	s, err := Open(Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	v, err := s.CreateVolume(ctx, VolumeSpec{Name: "v", SizeBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	exts, trusted, _ := s.BeginTracking(ctx, v.ID)
	tr, _ := cbt.NewTracker(size, 1, exts, trusted)
	f, err := os.OpenFile(s.VolumeFile(v.ID), os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
	hold := func(context.Context) (func() error, error) { return func() error { return nil }, nil }
	cut := &ChangeCut{Cut: func() ([]cbt.Extent, bool, error) { e, ok := tr.Cut(); return e, ok, nil },
		PutBack: func(e []cbt.Extent, ok bool) error { tr.PutBack(e, ok); return nil }}
	base, err := s.CreateSnapshotTracked(ctx, "base", v.ID, hold, cut)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	chunks := size / cbt.Granularity
	for range chunks / 100 {
		off := rng.Int64N(chunks) * cbt.Granularity
		tr.Queue(0).Mark(off, 4096)
		if _, err := f.WriteAt(buf[:4096], off); err != nil {
			b.Fatal(err)
		}
		buf[0]++
	}
	f.Close()
	target, err := s.CreateSnapshotTracked(ctx, "target", v.ID, hold, cut)
	if err != nil {
		b.Fatal(err)
	}
	drop := func() {
		for _, id := range []string{base.ID, target.ID} {
			testfs.DropCache(b, s.dataFile(id))
		}
	}
	for b.Loop() {
		drop()
		start := time.Now()
		got, _, how, err := s.Delta(ctx, base.ID, target.ID, true)
		if err != nil || how != DeltaTracked {
			b.Fatalf("tracked delta: %v %s", err, how)
		}
		b.ReportMetric(time.Since(start).Seconds(), "tracked-s")
		b.ReportMetric(float64(cbt.Total(got))/float64(size)*100, "tracked-%")
		drop()
		start = time.Now()
		got, _, how, err = s.Delta(ctx, base.ID, target.ID, false)
		if err != nil || how != DeltaCompared {
			b.Fatalf("compared delta: %v %s", err, how)
		}
		b.ReportMetric(time.Since(start).Seconds(), "compared-s")
		b.ReportMetric(float64(cbt.Total(got))/float64(size)*100, "compared-%")
		drop()
		start = time.Now()
		r, err := os.Open(s.dataFile(target.ID))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.CopyBuffer(io.Discard, r, make([]byte, 1<<20)); err != nil {
			b.Fatal(err)
		}
		r.Close()
		b.ReportMetric(time.Since(start).Seconds(), "readall-s")
	}
}
