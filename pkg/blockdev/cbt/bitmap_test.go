package cbt

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

const g = Granularity

func TestBitmapMarks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int64
		marks []Extent
		want  []Extent
	}{
		{"nothing", 1 << 30, nil, nil},
		{"one byte marks its chunk", 1 << 30, []Extent{{g + 5, 1}}, []Extent{{g, g}}},
		{"a write across a chunk edge", 1 << 30, []Extent{{g - 512, 1024}}, []Extent{{0, 2 * g}}},
		{"overlapping writes merge", 1 << 30, []Extent{{0, 4096}, {2048, g}, {3 * g, g}, {3*g + 100, 10}}, []Extent{{0, 2 * g}, {3 * g, g}}},
		{"touching runs merge", 1 << 30, []Extent{{0, g}, {g, g}}, []Extent{{0, 2 * g}}},
		{"a run across words", 1 << 30, []Extent{{60 * g, 10 * g}}, []Extent{{60 * g, 10 * g}}},
		{"a whole word", 1 << 30, []Extent{{64 * g, 64 * g}}, []Extent{{64 * g, 64 * g}}},
		{"a discard of the whole device", 1 << 30, []Extent{{0, 1 << 30}}, []Extent{{0, 1 << 30}}},
		{"the last partial chunk is clipped", g + 4096, []Extent{{g, 4096}}, []Extent{{g, 4096}}},
		{"a write past the end marks the rest of the device", 8 * g, []Extent{{7 * g, 2 * g}}, []Extent{{7 * g, math.MaxInt64 - 7*g}}},
		{"a write wholly past the end", 8 * g, []Extent{{20 * g, g}}, []Extent{{8 * g, math.MaxInt64 - 8*g}}},
		{"empty and negative marks are ignored", 8 * g, []Extent{{0, 0}, {-1, 10}, {g, -5}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBitmap(tc.size)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.marks {
				b.Mark(m.Offset, m.Length)
			}
			if got := b.Cut(); !slices.Equal(got, tc.want) {
				t.Fatalf("cut = %v, want %v", got, tc.want)
			}
			if got := b.Cut(); got != nil {
				t.Fatalf("second cut = %v, want nothing", got)
			}
		})
	}
}

// TestBitmapMatchesBruteForce marks random requests and compares the cut
// with a chunk-by-chunk model.
func TestBitmapMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 300*g + 4096
	for range 200 {
		b, _ := NewBitmap(size)
		model := make([]bool, (size+g-1)/g)
		for range rng.IntN(30) {
			off := rng.Int64N(size)
			n := 1 + rng.Int64N(min(size-off, 20*g))
			b.Mark(off, n)
			for c := off / g; c <= (off+n-1)/g; c++ {
				model[c] = true
			}
		}
		var want []Extent
		for c, set := range model {
			if set {
				want = append(want, Extent{int64(c) * g, min(g, size-int64(c)*g)})
			}
		}
		if got := b.Cut(); !slices.Equal(got, Normalize(want)) {
			t.Fatalf("cut = %v, want %v", got, Normalize(want))
		}
	}
}

// TestCutLosesNoConcurrentMark marks from several goroutines (as queue
// threads do) while another cuts: every mark is in exactly one cut or in
// the final one, never lost.
func TestCutLosesNoConcurrentMark(t *testing.T) {
	const size = 1024 * g
	b, _ := NewBitmap(size)
	n := 20000
	if testing.Short() {
		n = 2000
	}
	var wg sync.WaitGroup
	marked := make([][]int64, 4)
	for w := range marked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range n {
				c := rng.Int64N(size / g)
				b.Mark(c*g, 4096)
				marked[w] = append(marked[w], c)
			}
		}()
	}
	var cuts []Extent
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for loop := true; loop; {
		select {
		case <-done:
			loop = false
		default:
		}
		cuts = append(cuts, b.Cut()...)
	}
	cuts = Union(cuts, b.Cut())
	for _, cs := range marked {
		for _, c := range cs {
			if len(Clip(cuts, c*g, c*g+4096)) == 0 {
				t.Fatalf("mark of chunk %d lost", c)
			}
		}
	}
}

// TestLargeDevicesGetCoarserChunks: no bitmap exceeds 1 MiB; a device of
// up to 512 GiB has 64 KiB chunks, a larger one the next power of two.
func TestLargeDevicesGetCoarserChunks(t *testing.T) {
	for _, tc := range []struct {
		size, gran int64
	}{
		{0, g}, {1, g}, {512 << 30, g}, {512<<30 + 4096, 2 * g}, {1 << 40, 2 * g}, {64 << 40, 128 * g},
	} {
		b, err := NewBitmap(tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if b.Granularity() != tc.gran || len(b.words)*8 > 1<<20 {
			t.Fatalf("%d bytes: chunks of %d and %d bytes of bitmap, want chunks of %d", tc.size, b.Granularity(), len(b.words)*8, tc.gran)
		}
		if tc.size > 0 {
			b.Mark(tc.size-1, 1)
			if got := b.Cut(); len(got) != 1 || got[0].End() != tc.size || got[0].Length > tc.gran {
				t.Fatalf("%d bytes: last byte marked as %v", tc.size, got)
			}
		}
	}
}

func TestMarkDoesNotAllocate(t *testing.T) {
	b, _ := NewBitmap(1 << 30)
	if n := testing.AllocsPerRun(100, func() { b.Mark(12345, 4096) }); n != 0 {
		t.Fatalf("Mark allocates %v times", n)
	}
}

func TestTrackerTrust(t *testing.T) {
	t.Run("a carried trusted record is cut with the queues' marks", func(t *testing.T) {
		tr, err := NewTracker(64*g, 2, []Extent{{0, g}}, true)
		if err != nil {
			t.Fatal(err)
		}
		tr.Queue(0).Mark(10*g, 1)
		tr.Queue(1).Mark(11*g, 1)
		exts, trusted := tr.Cut()
		if want := []Extent{{0, g}, {10 * g, 2 * g}}; !slices.Equal(exts, want) || !trusted {
			t.Fatalf("cut = %v %v, want %v trusted", exts, trusted, want)
		}
	})
	t.Run("an untrusted record is trusted after its first cut", func(t *testing.T) {
		tr, _ := NewTracker(64*g, 1, nil, false)
		tr.Queue(0).Mark(0, 1)
		if _, trusted := tr.Cut(); trusted {
			t.Fatal("first cut of a re-adopted device trusted")
		}
		tr.Queue(0).Mark(g, 1)
		if exts, trusted := tr.Cut(); !trusted || !slices.Equal(exts, []Extent{{g, g}}) {
			t.Fatalf("second cut = %v %v", exts, trusted)
		}
	})
	t.Run("a cut put back after a failed snapshot comes again, as trusted as it was", func(t *testing.T) {
		tr, _ := NewTracker(64*g, 1, nil, false)
		tr.Queue(0).Mark(0, 1)
		exts, trusted := tr.Cut()
		tr.Queue(0).Mark(5*g, 1)
		tr.PutBack(exts, trusted)
		got, trusted := tr.Cut()
		if trusted || !slices.Equal(got, []Extent{{0, g}, {5 * g, g}}) {
			t.Fatalf("cut after put back = %v %v, want both ranges, untrusted", got, trusted)
		}
	})
	t.Run("queues it does not have", func(t *testing.T) {
		tr, _ := NewTracker(g, 1, nil, true)
		if tr.Queue(1) != nil || tr.Queue(-1) != nil {
			t.Fatal("queue out of range")
		}
		if _, err := NewTracker(g, 0, nil, true); err == nil {
			t.Fatal("tracker of no queues made")
		}
	})
}

// BenchmarkMark is the data path's cost of recording one request: a 4 KiB
// write into a chunk marked since the last cut (the common case: a plain
// load), into a fresh chunk (one locked OR), and a 1 MiB write (16 chunks,
// one word).
func BenchmarkMark(b *testing.B) {
	const size = 10 << 30
	bm, _ := NewBitmap(size)
	b.Run("4k-marked", func(b *testing.B) {
		b.ReportAllocs()
		bm.Mark(0, size)
		rng := rand.New(rand.NewPCG(1, 1))
		offs := make([]int64, 4096)
		for i := range offs {
			offs[i] = rng.Int64N(size/4096) * 4096
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			bm.Mark(offs[i&4095], 4096)
		}
	})
	b.Run("4k-fresh", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			off := int64(i) * g % size
			if off == 0 {
				b.StopTimer()
				bm.Cut()
				b.StartTimer()
			}
			bm.Mark(off, 4096)
		}
	})
	b.Run("1m", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			bm.Mark(int64(i)<<20%size, 1<<20)
		}
	})
}

func BenchmarkCut10GiB(b *testing.B) {
	bm, _ := NewBitmap(10 << 30)
	for i := 0; i < b.N; i++ {
		for j := int64(0); j < 1600; j++ { // 1% of the chunks
			bm.Mark(j*100*g, 4096)
		}
		bm.Cut()
	}
}
