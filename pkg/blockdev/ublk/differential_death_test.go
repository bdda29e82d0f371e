//go:build failpoint

package ublk

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestServerAnswersAsLoopDoesThroughThreadDeaths runs the differential test
// while server threads fail at random moments (issue 43): in each window of
// a thread's loop (before an io_uring_enter, in it, in the middle of the
// round's dispatch, at a round's start), half of the time with the close of
// its ring held back after the thread exited. Each failure must heal
// within healDeadline, every request on the server's volume must still
// answer as on loop, the final images must be equal, and no io-wq worker
// may be left blocked. It prints the heal times and how many failures
// landed in each window. Cost: 52 failures, about a minute in the VM.
func TestServerAnswersAsLoopDoesThroughThreadDeaths(t *testing.T) {
	needUblk(t)
	diffRounds(t, func(round int, seed uint64) {
		heals, landed := deathRound(t, seed)
		slices.Sort(heals)
		t.Logf("round %d: seed %d: %d thread failures healed: median %v, max %v; by window: %v", round, seed,
			len(heals), heals[len(heals)/2].Round(time.Millisecond), heals[len(heals)-1].Round(time.Millisecond), landed)
	})
}

// deathRound runs one round of the thread-death test with seed and returns
// the heal times and where the failures landed.
func deathRound(t *testing.T, seed uint64) ([]time.Duration, map[string]int) {
	const perVolume = 13
	rng := rand.New(rand.NewPCG(seed, 1))
	var heals []time.Duration
	landed := map[string]int{}
	for _, c := range []struct {
		v  diffVolume
		qd int
	}{
		{diffVolume{"3GiB", 3 << 30, false}, 32},
		{diffVolume{"1MiB-prealloc", 1 << 20, true}, 1},
		{diffVolume{"17GiB", 17 << 30, false}, 32},
		{diffVolume{"1MiB", 1 << 20, false}, 32},
	} {
		name := fmt.Sprintf("%s/qd%d", c.v.name, c.qd)
		p, err := newDiffPair(t, c.v, ServerConfig{Threads: 2})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			chaosErr error
			stop     = make(chan struct{})
			done     = make(chan struct{})
		)
		krng := rand.New(rand.NewPCG(rng.Uint64(), 2))
		wg.Go(func() {
			defer close(done)
			for k, missed := 0, 0; k < perVolume; k++ {
				w := dataplane.FailWindows[k%len(dataplane.FailWindows)]
				var hold time.Duration
				if krng.IntN(2) == 0 {
					hold = time.Duration(1+krng.IntN(50)) * time.Millisecond
				}
				took, ok, err := failAndHeal(p.s, krng, w, hold, stop)
				if err != nil {
					mu.Lock()
					chaosErr = fmt.Errorf("failure %d (%v, ring close held %v): %w", k, w, hold, err)
					mu.Unlock()
					return
				}
				if !ok {
					if missed++; missed > 20 {
						mu.Lock()
						chaosErr = fmt.Errorf("failure %d: the window %v was not reached in 20 tries", k, w)
						mu.Unlock()
						return
					}
					k-- // the window was not reached: try again
					continue
				}
				mu.Lock()
				heals = append(heals, took)
				label := w.String()
				if hold > 0 {
					label += ", close held"
				}
				landed[label]++
				mu.Unlock()
			}
		})
		var tally diffTally
		for chunk := uint64(0); !closed(done); chunk++ {
			got, err := compareDevices(p.f, p.lim, c.qd, 32, rand.New(rand.NewPCG(seed, chunk)))
			tally.add(got)
			if err != nil {
				close(stop)
				wg.Wait()
				p.close()
				t.Fatalf("%s: seed %d (replay: -diff.seed=%d): %v", name, seed, seed, err)
			}
		}
		wg.Wait()
		if chaosErr != nil {
			p.close()
			t.Fatalf("%s: seed %d: %v", name, seed, chaosErr)
		}
		images, err := p.sameImages()
		tally.images = images
		if err != nil {
			p.close()
			t.Fatalf("%s: %v", name, err)
		}
		p.close()
		t.Logf("%s: %v, through %d thread failures", name, tally, perVolume)
	}
	if stuck := blockedWorkers(); len(stuck) > 0 {
		t.Fatalf("io-wq workers left blocked: %v", stuck)
	}
	return heals, landed
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// healDeadline bounds one failure's heal.
const healDeadline = 30 * time.Second

// failAndHeal fails one thread that serves the volume at window w (the
// close of its ring held back hold), waits until its volume is served again
// and health is good, and returns how long the heal took. ok is false when
// the thread did not reach the window within a few seconds (no I/O went
// through it).
func failAndHeal(s *Server, rng *rand.Rand, w dataplane.FailWindow, hold time.Duration, stop <-chan struct{}) (took time.Duration, ok bool, err error) {
	select {
	case <-stop:
		return 0, false, fmt.Errorf("stopped")
	case <-time.After(time.Duration(rng.IntN(200)) * time.Millisecond):
	}
	sv := s.get("diff")
	if sv == nil {
		return 0, false, fmt.Errorf("the volume is gone")
	}
	qs := sv.dev.queues
	th := qs[rng.IntN(len(qs))].Thread()
	undo := dataplane.FailThreadAt(th, w, hold)
	select {
	case <-th.Done():
	case <-time.After(3 * time.Second):
		undo()
		return 0, false, nil
	}
	failed := time.Now()
	undo()
	for {
		if sv := s.get("diff"); sv != nil && !sv.dev.servedBy(th) && sv.dev.Err() == nil && s.Health() == nil {
			return time.Since(failed), true, nil
		}
		if time.Since(failed) > healDeadline {
			return 0, false, fmt.Errorf("not healed within %v: health: %v", healDeadline, s.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blockedWorkers lists this process's io-wq workers in uninterruptible
// sleep (state D): a control command that never returned leaves one.
func blockedWorkers() []string {
	var out []string
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, e := range tasks {
		stat, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ...: comm may hold spaces, state follows ") ".
		s := string(stat)
		i, j := strings.IndexByte(s, '('), strings.LastIndex(s, ") ")
		if i < 0 || j < 0 || j+2 >= len(s) {
			continue
		}
		if comm := s[i+1 : j]; strings.HasPrefix(comm, "iou-wrk") && s[j+2] == 'D' {
			out = append(out, e.Name()+":"+comm)
		}
	}
	return out
}
