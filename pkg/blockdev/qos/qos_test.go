package qos

import (
	"sync"
	"testing"
	"time"
)

const sec = int64(time.Second)

func TestUnlimitedStartsAtOnce(t *testing.T) {
	var l Limiter
	for i := range 1000 {
		now := int64(i) * 1000
		if got := l.Book(now, 1<<20); got > now {
			t.Fatalf("booking %d at %d starts at %d: an unlimited device must never wait", i, now, got)
		}
	}
	if !l.Limits().IsZero() {
		t.Fatal("zero Limiter reports a limit")
	}
}

// A burst of simultaneous requests: the first Burst's worth go at once,
// then one every 1/rate.
func TestIOPSPacesABurst(t *testing.T) {
	l := New(Limits{IOPS: 1000}) // 1 ms per request, Burst = 50 requests
	now := 10 * sec
	immediate := 0
	var last int64
	for i := range 200 {
		at := l.Book(now, 4096)
		if at <= now {
			immediate++
		}
		if i > 0 && at < last {
			t.Fatalf("booking %d starts at %d, before booking %d at %d", i, at, i-1, last)
		}
		last = at
	}
	if immediate != 50 && immediate != 51 {
		t.Errorf("%d of 200 simultaneous requests start at once; want Burst × rate = 50", immediate)
	}
	// The 200th starts 150 ms after the credit ran out.
	if want := now + 149*int64(time.Millisecond); last < want-int64(time.Millisecond) || last > want+int64(time.Millisecond) {
		t.Errorf("last booking starts at +%v, want about +149ms", time.Duration(last-now))
	}
}

// simulate runs a closed loop of depth requests of size bytes for dur
// (simulated): each request starts at its booked time (or at once) and
// completes after svc, then the next one is booked. It returns the requests
// and bytes done.
func simulate(l *Limiter, depth int, size uint32, svc, dur int64) (ops, bytes int64) {
	start := 100 * sec
	next := make([]int64, depth) // when each slot books its next request
	for i := range next {
		next[i] = start
	}
	for {
		// The slot that books first (a queue's requests arrive in time order).
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		now := next[i]
		if now >= start+dur {
			return ops, bytes
		}
		at := max(l.Book(now, size), now)
		next[i] = at + svc
		if at+svc <= start+dur {
			ops++
			bytes += int64(size)
		}
	}
}

func TestSustainedRateMatchesLimit(t *testing.T) {
	dur := 10 * sec
	for _, c := range []struct {
		name  string
		lim   Limits
		size  uint32
		depth int
		svc   time.Duration
		iops  int64 // expected per second
	}{
		{"iops 4k qd32", Limits{IOPS: 5000}, 4096, 32, 100 * time.Microsecond, 5000},
		{"iops qd1 fast device", Limits{IOPS: 2000}, 4096, 1, 10 * time.Microsecond, 2000},
		{"bandwidth 1M qd8", Limits{BytesPerSecond: 100 << 20}, 1 << 20, 8, time.Millisecond, 100},
		{"both, iops binds", Limits{IOPS: 1000, BytesPerSecond: 1 << 30}, 4096, 32, 50 * time.Microsecond, 1000},
		{"both, bandwidth binds", Limits{IOPS: 100000, BytesPerSecond: 64 << 20}, 128 << 10, 32, 50 * time.Microsecond, 512},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := New(c.lim)
			ops, _ := simulate(l, c.depth, c.size, int64(c.svc), dur)
			got := float64(ops) / 10
			// Burst credit allows at most 50 ms extra at the start.
			lo, hi := float64(c.iops)*0.99, float64(c.iops)*1.01+float64(c.iops)/20
			if got < lo || got > hi {
				t.Errorf("%.1f requests/s over 10 s, want %d (%.0f..%.0f)", got, c.iops, lo, hi)
			}
		})
	}
}

// A device slower than its limit is never held back.
func TestSlowDeviceIsNotThrottled(t *testing.T) {
	l := New(Limits{IOPS: 100000})
	ops, _ := simulate(l, 4, 4096, int64(time.Millisecond), 10*sec)
	if ops != 4*10*1000 {
		t.Errorf("%d requests in 10 s at depth 4 and 1 ms each, want 40000 (the limit is far above)", ops)
	}
}

// Concurrent bookers (queue threads) share one clock: n bookings at a
// fixed time advance it by exactly n costs past the credit.
func TestConcurrentBookingsShareTheRate(t *testing.T) {
	l := New(Limits{IOPS: 1000})
	now := 10 * sec
	var wg sync.WaitGroup
	starts := make([][]int64, 4)
	for g := range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				starts[g] = append(starts[g], l.Book(now, 512))
			}
		}()
	}
	wg.Wait()
	seen := map[int64]bool{}
	for _, s := range starts {
		for _, at := range s {
			if at <= now {
				continue // from the credit: at once
			}
			if seen[at] {
				t.Fatalf("two bookings got the same slot %d", at)
			}
			seen[at] = true
		}
	}
	// 2000 bookings at 1 ms each, the first 50 ms from credit.
	if got, want := l.ops.clock.Load(), now-int64(Burst)+2000*int64(time.Millisecond); got != want {
		t.Errorf("clock after 2000 bookings = %d, want %d", got, want)
	}
}

func TestSetAppliesAtOnce(t *testing.T) {
	l := New(Limits{IOPS: 1})
	now := 10 * sec
	for range 10 {
		l.Book(now, 4096) // books 10 s ahead
	}
	gen := l.Gen()
	l.Set(Limits{IOPS: 100000})
	if l.Gen() == gen {
		t.Error("Set did not change the generation")
	}
	if at := l.Book(now, 4096); at > now {
		t.Errorf("after raising the limit a request waits %v for bookings made under the old one", time.Duration(at-now))
	}
	if got := l.Limits(); got != (Limits{IOPS: 100000}) {
		t.Errorf("Limits() = %v", got)
	}
	l.Set(Limits{})
	if !l.Limits().IsZero() {
		t.Error("Set(Limits{}) left a limit")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		lim Limits
		ok  bool
	}{
		{Limits{}, true},
		{Limits{IOPS: 1}, true},
		{Limits{BytesPerSecond: 1 << 20}, true},
		{Limits{IOPS: -1}, false},
		{Limits{BytesPerSecond: 4096}, false},
		{Limits{BytesPerSecond: -5}, false},
	} {
		if err := c.lim.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%v) = %v, want ok=%v", c.lim, err, c.ok)
		}
	}
}
