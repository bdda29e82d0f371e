package dataplane

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

func TestDecodeDesc(t *testing.T) {
	cases := []struct {
		name               string
		opFlags, nrSectors uint32
		start              uint64
		want               request
	}{
		{"read 4k at 0", uapi.IOOpRead, 8, 0, request{op: uapi.IOOpRead, len: 4096}},
		{"write 1M at 1G", uapi.IOOpWrite, 2048, 1 << 21, request{op: uapi.IOOpWrite, off: 1 << 30, len: 1 << 20}},
		{"fua write", uapi.IOOpWrite | uapi.IOFlagFUA, 8, 8, request{op: uapi.IOOpWrite, flags: uapi.IOFlagFUA, off: 4096, len: 4096}},
		{"flush", uapi.IOOpFlush, 0, 0, request{op: uapi.IOOpFlush}},
		{"zeroes nounmap", uapi.IOOpWriteZeroes | uapi.IOFlagNoUnmap, 16, 2, request{op: uapi.IOOpWriteZeroes, flags: uapi.IOFlagNoUnmap, off: 1024, len: 8192}},
		{"beyond 2TiB", uapi.IOOpRead, 1, 1 << 33, request{op: uapi.IOOpRead, off: 1 << 42, len: 512}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := decodeDesc(c.opFlags, c.nrSectors, c.start); got != c.want {
				t.Fatalf("decodeDesc = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestPlanFor(t *testing.T) {
	punch := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
	zero := uint32(unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE)
	file, null := Target{Kind: TargetFile}, Target{Kind: TargetNull}
	// A preallocated volume's discards are switched off at the device
	// (blkdev.DisableDiscard); its write-zeroes keep the blocks.
	kept := Target{Kind: TargetFile, KeepAllocated: true}
	cases := []struct {
		name   string
		req    request
		target Target
		want   plan
	}{
		{"read", request{op: uapi.IOOpRead}, file, plan{act: actRead}},
		{"write", request{op: uapi.IOOpWrite}, file, plan{act: actWrite}},
		{"fua write", request{op: uapi.IOOpWrite, flags: uapi.IOFlagFUA}, file, plan{act: actWrite, rwFlags: unix.RWF_DSYNC}},
		{"flush", request{op: uapi.IOOpFlush}, file, plan{act: actFsync}},
		{"discard", request{op: uapi.IOOpDiscard}, file, plan{act: actFallocate, mode: punch}},
		{"write zeroes", request{op: uapi.IOOpWriteZeroes}, file, plan{act: actFallocate, mode: punch}},
		{"write zeroes nounmap", request{op: uapi.IOOpWriteZeroes, flags: uapi.IOFlagNoUnmap}, file, plan{act: actFallocate, mode: zero}},
		{"write zeroes kept allocated", request{op: uapi.IOOpWriteZeroes}, kept, plan{act: actFallocate, mode: zero}},
		{"write zeroes nounmap kept allocated", request{op: uapi.IOOpWriteZeroes, flags: uapi.IOFlagNoUnmap}, kept, plan{act: actFallocate, mode: zero}},
		{"discard kept allocated", request{op: uapi.IOOpDiscard}, kept, plan{act: actFallocate, mode: punch}},
		{"write same", request{op: uapi.IOOpWriteSame}, file, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
		{"zone op", request{op: 15}, file, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
		{"null read", request{op: uapi.IOOpRead}, null, plan{act: actComplete}},
		{"null flush", request{op: uapi.IOOpFlush}, null, plan{act: actComplete}},
		{"null unknown", request{op: 18}, null, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := planFor(c.req, c.target); got != c.want {
				t.Fatalf("planFor = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestFullResult(t *testing.T) {
	cases := []struct {
		name string
		req  request
		want int32
	}{
		{"read", request{op: uapi.IOOpRead, len: 4096}, 4096},
		{"write", request{op: uapi.IOOpWrite, len: 1 << 20}, 1 << 20},
		{"flush", request{op: uapi.IOOpFlush}, 0},
		{"discard", request{op: uapi.IOOpDiscard, len: 1 << 20}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := fullResult(c.req); got != c.want {
				t.Fatalf("fullResult = %d, want %d", got, c.want)
			}
		})
	}
}

func TestUserData(t *testing.T) {
	for _, kind := range []uint8{udCmd, udBacking, udWake, udRegBuf} {
		for _, slot := range []uint16{0, 1, 300, 65535} {
			for _, tag := range []uint16{0, 1, 127, 4095, 65535} {
				k, s, g := decodeUD(encodeUD(kind, slot, tag))
				if k != kind || s != slot || g != tag {
					t.Fatalf("decodeUD(encodeUD(%d, %d, %d)) = %d, %d, %d", kind, slot, tag, k, s, g)
				}
			}
		}
	}
}

func TestLatencyBucket(t *testing.T) {
	cases := []struct {
		name string
		ns   int64
		want int
	}{
		{"zero", 0, 0},
		{"first bound", int64(LatencyBuckets[0]), 0},
		{"just above first", int64(LatencyBuckets[0]) + 1, 1},
		{"overflow", int64(LatencyBuckets[len(LatencyBuckets)-1]) + 1, len(LatencyBuckets)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := latencyBucket(c.ns); got != c.want {
				t.Fatalf("latencyBucket(%d) = %d, want %d", c.ns, got, c.want)
			}
		})
	}
}

func TestStatsObserve(t *testing.T) {
	var tally, shown queueTally
	var s queueStats
	tally.observe(uapi.IOOpRead, 4096, false, 1000)
	tally.observe(uapi.IOOpWrite, 8192, true, 1000)
	tally.observe(uapi.IOOpFlush, 0, false, 1000)
	tally.observe(uapi.IOOpDiscard, 0, false, 1000)
	if got := s.snapshot(); got.Reads != 0 {
		t.Fatalf("counters visible before publish: %+v", got)
	}
	tally.publish(&s, &shown)
	got := s.snapshot()
	if got.Reads != 1 || got.Writes != 1 || got.Flushes != 1 || got.Discards != 1 ||
		got.BytesRead != 4096 || got.BytesWritten != 0 || got.Errors != 1 || got.Latency[0] != 4 {
		t.Fatalf("snapshot = %+v", got)
	}
	if sum := got.Add(got); sum.Reads != 2 || sum.Latency[0] != 8 {
		t.Fatalf("Add = %+v", sum)
	}
	if n := testing.AllocsPerRun(100, func() {
		tally.observe(uapi.IOOpRead, 4096, false, 50000)
		tally.publish(&s, &shown)
	}); n != 0 {
		t.Fatalf("observe and publish allocate %v times", n)
	}
}

// TestStatsConcurrent reads snapshots while the "server thread" records and
// publishes once per "round" of 8 requests; run with -race.
func TestStatsConcurrent(t *testing.T) {
	var s queueStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		var tally, shown queueTally
		for range 10000 / 8 {
			for range 8 {
				tally.inFlight++
				tally.observe(uapi.IOOpWrite, 4096, false, 100)
				tally.inFlight--
			}
			tally.publish(&s, &shown)
		}
	}()
	for {
		select {
		case <-done:
			if got := s.snapshot(); got.Writes != 10000 || got.BytesWritten != 10000*4096 || got.InFlight != 0 {
				t.Fatalf("snapshot = %+v", got)
			}
			return
		default:
			if st := s.snapshot(); st.InFlight != 0 || st.Writes%8 != 0 {
				t.Fatalf("a snapshot saw the middle of a round: %d in flight, %d writes", st.InFlight, st.Writes)
			}
		}
	}
}

// TestDecodeDescLimits pins which descriptors are out of range: READ and
// WRITE beyond the int32 result, any op beyond 32-bit bytes, and none of the
// DISCARD or WRITE_ZEROES sizes the device advertises.
func TestDecodeDescLimits(t *testing.T) {
	cases := []struct {
		name      string
		opFlags   uint32
		nrSectors uint32
		want      bool
	}{
		{"read 2GiB-512", uapi.IOOpRead, maxXferSectors, false},
		{"read 2GiB", uapi.IOOpRead, maxXferSectors + 1, true},
		{"write 2GiB", uapi.IOOpWrite, maxXferSectors + 1, true},
		{"discard 2GiB", uapi.IOOpDiscard, 2 << 30 >> 9, false},
		{"discard advertised max", uapi.IOOpDiscard, MaxZeroSectors, false},
		{"discard 4GiB wraps", uapi.IOOpDiscard, MaxZeroSectors + 1, true},
		{"write zeroes advertised max", uapi.IOOpWriteZeroes | uapi.IOFlagNoUnmap, MaxZeroSectors, false},
		{"write zeroes 4GiB wraps", uapi.IOOpWriteZeroes, MaxZeroSectors + 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := decodeDesc(c.opFlags, c.nrSectors, 0)
			if r.outOfRange != c.want {
				t.Fatalf("outOfRange = %v, want %v", r.outOfRange, c.want)
			}
			if !r.outOfRange && uint64(r.len) != uint64(c.nrSectors)<<9 {
				t.Fatalf("len = %d, want %d", r.len, uint64(c.nrSectors)<<9)
			}
		})
	}
}

// BenchmarkRequestCounters measures a request's bookkeeping (arrival, its
// backing operation's start and end, its completion) three ways side by
// side: one atomic add per counter and request, as the thread counted
// before (nine locked instructions per request on amd64), and the thread's
// plain counters published once per round of 32 requests (a busy queue) or
// after every request (queue depth 1).
func BenchmarkRequestCounters(b *testing.B) {
	b.Run("atomic per request", func(b *testing.B) {
		var s queueStats
		for b.Loop() {
			s.inFlight.Add(1)
			s.backing.Add(1)
			s.backing.Add(-1)
			s.inFlight.Add(-1)
			s.reads.Add(1)
			s.bytesRead.Add(4096)
			s.latency[latencyBucket(20000)].Add(1)
			s.latencyNs.Add(20000)
			s.commits.Add(1)
		}
	})
	for _, round := range []int{32, 1} {
		b.Run(fmt.Sprintf("plain, published per %d", round), func(b *testing.B) {
			var s queueStats
			var tally, shown queueTally
			n := 0
			for b.Loop() {
				tally.inFlight++
				tally.backing++
				tally.backing--
				tally.inFlight--
				tally.observe(uapi.IOOpRead, 4096, false, 20000)
				tally.commits++
				if n++; n == round {
					tally.publish(&s, &shown)
					n = 0
				}
			}
		})
	}
}
