// Package qos owns per-volume I/O rate limits. A Limiter paces one device's
// reads and writes to at most a number of requests and of bytes per second.
// All the queue threads of the device share it without a lock: a request
// books its slot with one compare-and-swap per limit and learns when it may
// start; the queue thread holds it until then (pkg/blockdev/ublk). Nothing
// here allocates, sleeps or reads a clock: callers pass the time.
package qos

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Limits are a volume's rate limits; a zero field means no limit.
type Limits struct {
	// IOPS bounds reads plus writes per second.
	IOPS int64 `json:"iops,omitempty"`
	// BytesPerSecond bounds the bytes read plus written per second.
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`
}

// Smallest limits accepted: below them a single request would wait for
// seconds.
const (
	MinIOPS           = 1
	MinBytesPerSecond = 1 << 20
)

// IsZero reports whether l limits nothing.
func (l Limits) IsZero() bool { return l.IOPS == 0 && l.BytesPerSecond == 0 }

// Validate reports limits that are negative or too small to serve a 1 MiB
// request per second.
func (l Limits) Validate() error {
	if l.IOPS < 0 || (l.IOPS > 0 && l.IOPS < MinIOPS) {
		return fmt.Errorf("iops limit %d: want 0 (none) or at least %d", l.IOPS, MinIOPS)
	}
	if l.BytesPerSecond < 0 || (l.BytesPerSecond > 0 && l.BytesPerSecond < MinBytesPerSecond) {
		return fmt.Errorf("bandwidth limit %d B/s: want 0 (none) or at least %d", l.BytesPerSecond, MinBytesPerSecond)
	}
	return nil
}

func (l Limits) String() string {
	if l.IsZero() {
		return "unlimited"
	}
	return fmt.Sprintf("iops=%d bytesPerSecond=%d", l.IOPS, l.BytesPerSecond)
}

// Burst is how far an idle device may run ahead of its rate: after a pause,
// requests worth Burst of the limit start at once. Small, so that a paced
// device's I/O stays smooth, and large enough that a queue thread woken a
// little late loses no throughput (the lag is made up from the credit).
const Burst = 50 * time.Millisecond

// Limiter paces one device. The zero value is unlimited and ready to use;
// it is safe for concurrent use.
type Limiter struct {
	ops, bytes pacer
	// gen counts changes of the limits, so that a queue thread holding
	// requests booked under the old ones can book them again.
	gen atomic.Uint64
}

// pacer is one rate limit in the manner of a virtual clock (GCRA): each
// booking advances the clock by its cost at the rate, and a booking may
// start when the clock, before it, has not run ahead of now. The clock
// never lags now by more than Burst, which is the credit an idle device
// keeps.
type pacer struct {
	rate  atomic.Int64 // units per second; 0 = unlimited
	clock atomic.Int64 // ns, on the callers' time base
}

// book reserves n units at now and returns when they may start; a time at
// or before now means at once. Bookings never fail and are never returned:
// the callers bound how many are outstanding (a queue's depth).
func (p *pacer) book(now, n int64) int64 {
	r := p.rate.Load()
	if r <= 0 {
		return now
	}
	// n is at most a request's 32-bit length, so n·1e9 fits in 63 bits.
	cost := n * int64(time.Second) / r
	for {
		old := p.clock.Load()
		start := max(old, now-int64(Burst))
		if p.clock.CompareAndSwap(old, start+cost) {
			return start
		}
	}
}

// Book reserves one request of n bytes at now (nanoseconds on the caller's
// clock) and returns when it may start: at or before now means at once.
// Later bookings never get an earlier time than earlier ones.
func (l *Limiter) Book(now int64, n uint32) int64 {
	return max(l.ops.book(now, 1), l.bytes.book(now, int64(n)))
}

// Limits returns the limits in force.
func (l *Limiter) Limits() Limits {
	return Limits{IOPS: l.ops.rate.Load(), BytesPerSecond: l.bytes.rate.Load()}
}

// Gen returns the generation of the limits; it changes with every Set.
func (l *Limiter) Gen() uint64 { return l.gen.Load() }

// Set puts new limits in force. The clocks restart with a full burst of
// credit, so that a raised limit applies at once rather than after the
// bookings made under the old one; queue threads see the new generation
// and book their held requests again.
func (l *Limiter) Set(lim Limits) {
	l.ops.rate.Store(max(lim.IOPS, 0))
	l.bytes.rate.Store(max(lim.BytesPerSecond, 0))
	l.ops.clock.Store(math.MinInt64) // before any now: a full burst
	l.bytes.clock.Store(math.MinInt64)
	l.gen.Add(1)
}

// New returns a Limiter with lim in force.
func New(lim Limits) *Limiter {
	l := new(Limiter)
	l.Set(lim)
	return l
}
