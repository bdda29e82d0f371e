package dataplane

import (
	"sync/atomic"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// LatencyBuckets are the upper bounds of the latency histogram buckets in
// QueueStats.Latency; the last bucket counts everything slower than the last
// bound. Fixed so that recording is one atomic add and no allocation.
var LatencyBuckets = [...]time.Duration{
	10 * time.Microsecond,
	25 * time.Microsecond,
	50 * time.Microsecond,
	100 * time.Microsecond,
	250 * time.Microsecond,
	500 * time.Microsecond,
	time.Millisecond,
	2500 * time.Microsecond,
	5 * time.Millisecond,
	10 * time.Millisecond,
	25 * time.Millisecond,
	50 * time.Millisecond,
	100 * time.Millisecond,
	250 * time.Millisecond,
	time.Second,
}

// NumLatencyBuckets is len(LatencyBuckets)+1 (the overflow bucket).
const NumLatencyBuckets = len(LatencyBuckets) + 1

// QueueStats is a snapshot of one queue's counters. Counters only grow,
// except InFlight, which is the number of requests the queue holds now.
// One field per counter (20): they are exported as they are, per volume.
type QueueStats struct {
	Reads, Writes, Flushes, Discards, WriteZeroes uint64
	BytesRead, BytesWritten                       uint64
	// Errors counts requests completed with an error.
	Errors uint64
	// InFlight is the number of requests received and not yet committed.
	InFlight int64
	// Latency counts requests by time from arrival to commit; bucket i
	// holds those at most LatencyBuckets[i] (and above bucket i-1).
	Latency [NumLatencyBuckets]uint64
	// LatencyNs is the sum of all those latencies, in nanoseconds.
	LatencyNs uint64
	// Commits counts the commands that gave results back to the kernel:
	// one per request, or in batch mode (UBLK_F_BATCH_IO) one per round.
	Commits uint64
	// Reclaims counts idle reclaims of the copy-mode buffer tails.
	Reclaims uint64
	// Throttled counts requests held back by the rate limits, and
	// ThrottledNs the time they were held, in nanoseconds.
	Throttled, ThrottledNs uint64
	// NowaitRefused counts backing writes RWF_NOWAIT refused
	// (QueueOptions.NowaitWrites), and NowaitPauses the refusals that
	// turned it off for nowaitPause; MtimeUpdates counts the backing
	// file's mtime updates the queue made for them (freshenMtime).
	NowaitRefused, NowaitPauses, MtimeUpdates uint64
	// DiskWaits counts reads and writes held for a disk slot of their
	// server thread (admission_linux.go).
	DiskWaits uint64
	// CopyOffloads counts, with USER_COPY, the requests whose data io-wq
	// copied, linked to their backing I/O (queue_copy_linux.go), and
	// PoolWaits those that waited for memory of the queue's pool
	// (queue_pool_linux.go).
	CopyOffloads, PoolWaits uint64
}

// queueStats is the live, atomically updated form of QueueStats, one
// atomic per counter (21 with backing). The server thread writes it (the
// per-request counters once per round: queueTally); Stats reads it from any
// goroutine.
type queueStats struct {
	reads, writes, flushes, discards, zeroes  atomic.Uint64
	bytesRead, bytesWritten                   atomic.Uint64
	errors                                    atomic.Uint64
	inFlight                                  atomic.Int64
	backing                                   atomic.Int64 // backing operations in flight (Device.Pause waits for none)
	latency                                   [NumLatencyBuckets]atomic.Uint64
	latencyNs                                 atomic.Uint64
	commits                                   atomic.Uint64
	reclaims                                  atomic.Uint64
	throttled, throttledNs                    atomic.Uint64
	nowaitRefused, nowaitPauses, mtimeUpdates atomic.Uint64
	diskWaits                                 atomic.Uint64
	copyOffloads, poolWaits                   atomic.Uint64
}

// latencyBucket returns the histogram bucket for a duration in nanoseconds.
func latencyBucket(ns int64) int {
	for i, b := range LatencyBuckets {
		if ns <= int64(b) {
			return i
		}
	}
	return len(LatencyBuckets)
}

// queueTally is the part of a queue's counters that changes with every
// request, as its server thread keeps them: plain fields, which only that
// thread writes. publish stores them in the queue's queueStats once per
// round, where an atomic add per request and counter was a locked
// instruction each (about nine per request).
type queueTally struct {
	reads, writes, flushes, discards, zeroes uint64
	bytesRead, bytesWritten                  uint64
	errors, latencyNs, commits, diskWaits    uint64
	offloaded, poolWaits                     uint64
	latency                                  [NumLatencyBuckets]uint64
	inFlight, backing                        int64
}

// observe records one finished request.
func (t *queueTally) observe(op uint8, bytes uint32, failed bool, ns int64) {
	if failed {
		t.errors++
		bytes = 0
	}
	switch op {
	case uapi.IOOpRead:
		t.reads++
		t.bytesRead += uint64(bytes)
	case uapi.IOOpWrite:
		t.writes++
		t.bytesWritten += uint64(bytes)
	case uapi.IOOpFlush:
		t.flushes++
	case uapi.IOOpDiscard:
		t.discards++
	case uapi.IOOpWriteZeroes:
		t.zeroes++
	}
	t.latency[latencyBucket(ns)]++
	t.latencyNs += uint64(ns)
}

// publish stores in s the counters of t that changed since shown, the
// values last stored, and updates shown: one store per changed counter.
func (t *queueTally) publish(s *queueStats, shown *queueTally) {
	store := func(a *atomic.Uint64, v uint64, last *uint64) {
		if v != *last {
			a.Store(v)
			*last = v
		}
	}
	store(&s.reads, t.reads, &shown.reads)
	store(&s.writes, t.writes, &shown.writes)
	store(&s.flushes, t.flushes, &shown.flushes)
	store(&s.discards, t.discards, &shown.discards)
	store(&s.zeroes, t.zeroes, &shown.zeroes)
	store(&s.bytesRead, t.bytesRead, &shown.bytesRead)
	store(&s.bytesWritten, t.bytesWritten, &shown.bytesWritten)
	store(&s.errors, t.errors, &shown.errors)
	store(&s.latencyNs, t.latencyNs, &shown.latencyNs)
	store(&s.commits, t.commits, &shown.commits)
	store(&s.diskWaits, t.diskWaits, &shown.diskWaits)
	store(&s.copyOffloads, t.offloaded, &shown.offloaded)
	store(&s.poolWaits, t.poolWaits, &shown.poolWaits)
	for i := range t.latency {
		store(&s.latency[i], t.latency[i], &shown.latency[i])
	}
	if t.inFlight != shown.inFlight {
		s.inFlight.Store(t.inFlight)
		shown.inFlight = t.inFlight
	}
	if t.backing != shown.backing {
		s.backing.Store(t.backing)
		shown.backing = t.backing
	}
}

func (s *queueStats) snapshot() QueueStats {
	out := QueueStats{
		Reads:         s.reads.Load(),
		Writes:        s.writes.Load(),
		Flushes:       s.flushes.Load(),
		Discards:      s.discards.Load(),
		WriteZeroes:   s.zeroes.Load(),
		BytesRead:     s.bytesRead.Load(),
		BytesWritten:  s.bytesWritten.Load(),
		Errors:        s.errors.Load(),
		InFlight:      s.inFlight.Load(),
		Reclaims:      s.reclaims.Load(),
		Throttled:     s.throttled.Load(),
		ThrottledNs:   s.throttledNs.Load(),
		NowaitRefused: s.nowaitRefused.Load(),
		NowaitPauses:  s.nowaitPauses.Load(),
		MtimeUpdates:  s.mtimeUpdates.Load(),
		DiskWaits:     s.diskWaits.Load(),
		CopyOffloads:  s.copyOffloads.Load(),
		PoolWaits:     s.poolWaits.Load(),
		Commits:       s.commits.Load(),
		LatencyNs:     s.latencyNs.Load(),
	}
	for i := range out.Latency {
		out.Latency[i] = s.latency[i].Load()
	}
	return out
}

// Add returns the element-wise sum of two snapshots (for per-device totals).
func (a QueueStats) Add(b QueueStats) QueueStats {
	a.Reads += b.Reads
	a.Writes += b.Writes
	a.Flushes += b.Flushes
	a.Discards += b.Discards
	a.WriteZeroes += b.WriteZeroes
	a.BytesRead += b.BytesRead
	a.BytesWritten += b.BytesWritten
	a.Errors += b.Errors
	a.InFlight += b.InFlight
	a.Reclaims += b.Reclaims
	a.Throttled += b.Throttled
	a.ThrottledNs += b.ThrottledNs
	a.NowaitRefused += b.NowaitRefused
	a.NowaitPauses += b.NowaitPauses
	a.MtimeUpdates += b.MtimeUpdates
	a.DiskWaits += b.DiskWaits
	a.CopyOffloads += b.CopyOffloads
	a.PoolWaits += b.PoolWaits
	a.Commits += b.Commits
	a.LatencyNs += b.LatencyNs
	for i := range a.Latency {
		a.Latency[i] += b.Latency[i]
	}
	return a
}
