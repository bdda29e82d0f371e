package ublk

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestDecodeDesc(t *testing.T) {
	cases := []struct {
		name               string
		opFlags, nrSectors uint32
		start              uint64
		want               request
	}{
		{"read 4k at 0", ioOpRead, 8, 0, request{op: ioOpRead, len: 4096}},
		{"write 1M at 1G", ioOpWrite, 2048, 1 << 21, request{op: ioOpWrite, off: 1 << 30, len: 1 << 20}},
		{"fua write", ioOpWrite | ioFlagFUA, 8, 8, request{op: ioOpWrite, flags: ioFlagFUA, off: 4096, len: 4096}},
		{"flush", ioOpFlush, 0, 0, request{op: ioOpFlush}},
		{"zeroes nounmap", ioOpWriteZeroes | ioFlagNoUnmap, 16, 2, request{op: ioOpWriteZeroes, flags: ioFlagNoUnmap, off: 1024, len: 8192}},
		{"beyond 2TiB", ioOpRead, 1, 1 << 33, request{op: ioOpRead, off: 1 << 42, len: 512}},
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
	cases := []struct {
		name string
		req  request
		kind TargetKind
		want plan
	}{
		{"read", request{op: ioOpRead}, TargetFile, plan{act: actRead}},
		{"write", request{op: ioOpWrite}, TargetFile, plan{act: actWrite}},
		{"fua write", request{op: ioOpWrite, flags: ioFlagFUA}, TargetFile, plan{act: actWrite, rwFlags: unix.RWF_DSYNC}},
		{"flush", request{op: ioOpFlush}, TargetFile, plan{act: actFsync}},
		{"discard", request{op: ioOpDiscard}, TargetFile, plan{act: actFallocate, mode: punch}},
		{"write zeroes", request{op: ioOpWriteZeroes}, TargetFile, plan{act: actFallocate, mode: punch}},
		{"write zeroes nounmap", request{op: ioOpWriteZeroes, flags: ioFlagNoUnmap}, TargetFile, plan{act: actFallocate, mode: zero}},
		{"write same", request{op: ioOpWriteSame}, TargetFile, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
		{"zone op", request{op: 15}, TargetFile, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
		{"null read", request{op: ioOpRead}, TargetNull, plan{act: actComplete}},
		{"null flush", request{op: ioOpFlush}, TargetNull, plan{act: actComplete}},
		{"null unknown", request{op: 18}, TargetNull, plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := planFor(c.req, c.kind); got != c.want {
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
		{"read", request{op: ioOpRead, len: 4096}, 4096},
		{"write", request{op: ioOpWrite, len: 1 << 20}, 1 << 20},
		{"flush", request{op: ioOpFlush}, 0},
		{"discard", request{op: ioOpDiscard, len: 1 << 20}, 0},
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
	var s queueStats
	s.observe(ioOpRead, 4096, false, 1000)
	s.observe(ioOpWrite, 8192, true, 1000)
	s.observe(ioOpFlush, 0, false, 1000)
	s.observe(ioOpDiscard, 0, false, 1000)
	got := s.snapshot()
	if got.Reads != 1 || got.Writes != 1 || got.Flushes != 1 || got.Discards != 1 ||
		got.BytesRead != 4096 || got.BytesWritten != 0 || got.Errors != 1 || got.Latency[0] != 4 {
		t.Fatalf("snapshot = %+v", got)
	}
	if sum := got.Add(got); sum.Reads != 2 || sum.Latency[0] != 8 {
		t.Fatalf("Add = %+v", sum)
	}
	if n := testing.AllocsPerRun(100, func() { s.observe(ioOpRead, 4096, false, 50000) }); n != 0 {
		t.Fatalf("observe allocates %v times", n)
	}
}

// TestStatsConcurrent reads snapshots while the "queue thread" records;
// run with -race.
func TestStatsConcurrent(t *testing.T) {
	var s queueStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 10000 {
			s.inFlight.Add(1)
			s.observe(ioOpWrite, 4096, false, 100)
			s.inFlight.Add(-1)
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
			if st := s.snapshot(); st.InFlight < 0 || st.InFlight > 1 {
				t.Fatalf("in flight %d", st.InFlight)
			}
		}
	}
}
