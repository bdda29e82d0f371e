package bench

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// TestJobOffersBeforeSleeping proves a bench job, like a ublk queue thread,
// offers itself to the Go scheduler before its sleeping waits, once per
// uring.OfferInterval and no more often.
func TestJobOffersBeforeSleeping(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{File: file, Size: 1 << 20, RW: "randread", BS: 4096, IODepth: 1, Jobs: 1,
		Runtime: time.Second} // Poll 0: every round sleeps
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	j := &job{cfg: &cfg, stop: &stop}
	start := time.Now()
	// Stopped after its second offer, however long a loaded machine takes
	// to get there: the bound below is on the offers' rate, not on time.
	done := make(chan struct{})
	defer close(done)
	go func() {
		for j.offers.Load() < 2 && time.Since(start) < time.Minute {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
		stop.Store(true)
	}()
	if err := j.run(); err != nil {
		t.Fatal(err)
	}
	offers := j.offers.Load()
	most := uint64(time.Since(start)/uring.OfferInterval) + 1
	if j.ios == 0 || offers < 2 || offers > most {
		t.Fatalf("%d I/Os, %d offers in %v; want I/O and 2 to %d offers", j.ios, offers, time.Since(start), most)
	}
}
