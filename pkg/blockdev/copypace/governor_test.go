package copypace

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// fastGovernor is a Governor watching devs, with short cycles for a test.
func fastGovernor(devs func(context.Context) ([]string, error)) *Governor {
	g := New(Config{Devices: devs})
	g.timing = timing{run: 200 * time.Millisecond, watch: 100 * time.Millisecond, pause: 150 * time.Millisecond, settle: 30 * time.Millisecond}
	return g
}

// stopped waits until g's control loop has ended.
func stopped(t *testing.T, g *Governor) {
	t.Helper()
	waitFor(t, "stopped", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return !g.running
	})
}

// loopDevice attaches a loop device over a file of size bytes and
// returns its path.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	testgate.RequireRoot(t)
	testgate.RequireLoop(t)
	file := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(file, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(file, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.Detach(dev.Path, 10*time.Second); err != nil {
			t.Errorf("detach %s: %v", dev.Path, err)
		}
	})
	return dev.Path
}

// readLoad reads the device in direct 4 KiB reads, each under the read
// lock of hog, until ctx ends; it counts them in n.
func readLoad(ctx context.Context, t *testing.T, dev string, hog *sync.RWMutex, n *atomic.Int64) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Error(err)
		return
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Error(err)
		return
	}
	defer unix.Munmap(buf)
	for off := int64(0); ctx.Err() == nil; off = (off + 4096) % (1 << 20) {
		hog.RLock()
		_, err := unix.Pread(fd, buf, off)
		hog.RUnlock()
		if err != nil {
			t.Error(err)
			return
		}
		n.Add(1)
	}
}

// quiet waits until dev's I/O counters stay still for 200 ms (udev's
// probe of a new device done).
func quiet(t *testing.T, dev string) {
	t.Helper()
	last := readAll([]string{dev})[dev]
	for still := time.Now(); time.Since(still) < 200*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if now := readAll([]string{dev})[dev]; now != last {
			last, still = now, time.Now()
		}
	}
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still not %s after a minute", what)
		}
	}
}

// TestGovernorHoldsBackCostlyCopy: a real loop device reads while a copy
// runs, but each of the copy's chunks holds the device's reads back for a
// millisecond (the copy takes the lock the reads need), so that the faster
// the copy, the fewer reads: the Governor pauses the copy to measure the
// device without it, lets it speed up while it costs little, and cuts its
// rate once it costs the device more than the aim; the copy goes on, and
// when it ends the control loop stops and leaves nothing paused.
func TestGovernorHoldsBackCostlyCopy(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hog sync.RWMutex
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); readLoad(ctx, t, dev, &hog, &reads) }()

	g := fastGovernor(func(context.Context) ([]string, error) { return []string{dev}, nil })
	p := g.Pacer(0)
	var chunks atomic.Int64
	go func() {
		defer wg.Done()
		defer p.Close()
		for ctx.Err() == nil {
			if err := p.Wait(ctx, 1<<20); err != nil {
				return
			}
			hog.Lock()
			time.Sleep(time.Millisecond) // the chunk's work, which the reads wait for
			hog.Unlock()
			chunks.Add(1)
		}
	}()
	// Unpaced, at 1 MiB a millisecond, the copy would cost the reads
	// most of their IOPS; its rate grows from its floor until a cycle
	// finds it costs more than the aim, and is then cut back.
	target := DefaultBudget * aim
	waitFor(t, "cut back", func() bool { st := g.Status(); return st.Cost > target && st.Bounded })
	st := g.Status()
	if st.Device != dev || st.Pauses < 2 {
		t.Errorf("status after the cut: %+v; want pauses that measured %s", st, dev)
	}
	if st.AllowedBytesPerSecond > 500<<20 {
		t.Errorf("allowance %.0f B/s after a cost of %.2f: the copy was not held back", st.AllowedBytesPerSecond, st.Cost)
	}
	before := chunks.Load()
	waitFor(t, "moving again", func() bool { return chunks.Load() > before+10 })
	if reads.Load() == 0 {
		t.Error("no read completed")
	}
	cancel()
	wg.Wait()
	stopped(t, g)
	if st := g.Status(); st.Copies != 0 || st.Bounded || g.paused != nil {
		t.Errorf("after the copy: status %+v, paused %v; want no copy, no bound, no pause", st, g.paused != nil)
	}
}

// TestGovernorLeavesIdleVolumesAlone: while no device does I/O, a copy is
// neither bounded nor paused, whatever it moves, but for the one pause that
// looks at the devices before it starts.
func TestGovernorLeavesIdleVolumesAlone(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	quiet(t, dev)
	var looks atomic.Int64
	g := fastGovernor(func(context.Context) ([]string, error) {
		looks.Add(1)
		return []string{dev}, nil
	})
	p := g.Pacer(0)
	defer stopped(t, g)
	defer p.Close()
	ctx := context.Background()
	for looks.Load() < 6 { // five whole cycles
		if err := p.Wait(ctx, 1<<20); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if st := g.Status(); st.Pauses != 1 || st.Bounded || !math.IsInf(p.limit(), 1) {
		t.Errorf("status %+v, limit %.0f; want the one pause before the copy started, and no bound", st, p.limit())
	}
}
