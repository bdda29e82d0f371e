package uring

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const wakeTag = 1 << 63

func TestWaitTimeout(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	w := newWaker(t)
	t.Run("nothing in flight returns at once", func(t *testing.T) {
		if _, err := r.SubmitAndWait(1, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	w.PrepPoll(r.GetSQE(), wakeTag)
	start := time.Now()
	_, err := r.SubmitAndWait(1, 50*time.Millisecond)
	if !errors.Is(err, unix.ETIME) {
		t.Fatalf("wait with armed poll: %v, want ETIME", err)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Errorf("timed out after %v, before the 50ms timeout", el)
	}
	if r.InFlight() != 1 {
		t.Errorf("in flight %d, want the poll", r.InFlight())
	}
}

func newWaker(t *testing.T) *Waker {
	t.Helper()
	w, err := NewWaker()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestWaker(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	w := newWaker(t)
	cqes := make([]CQE, 4)
	for round := range 3 {
		w.PrepPoll(r.GetSQE(), wakeTag)
		if _, err := r.Submit(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := w.Wake(); err != nil {
				t.Error(err)
			}
		})
		if _, err := r.SubmitAndWait(1, 0); err != nil { // no timeout: only the wake can end it
			t.Fatal(err)
		}
		wg.Wait()
		n := r.Reap(cqes)
		if n != 1 || cqes[0].UserData != wakeTag || cqes[0].Res&unix.POLLIN == 0 {
			t.Fatalf("round %d: %d cqes, first %+v", round, n, cqes[0])
		}
		if v, err := w.Drain(); err != nil || v == 0 {
			t.Fatalf("round %d: drain %d, %v", round, v, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := w.Wake(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Wake after Close: %v", err)
	}
}

// TestSignalStorm sends signals to the ring's thread while it waits and
// does I/O; no EINTR may leak and timed waits keep their deadline.
func TestSignalStorm(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 16, Flags: QueueFlags})
	w := newWaker(t)
	f := directFile(t, 16*blk)
	bufs := newBuffers(t, 16, blk)
	tid, pid := unix.Gettid(), unix.Getpid()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = unix.Tgkill(pid, tid, syscall.SIGURG) // the runtime ignores stray SIGURG
		}
	})
	defer func() { close(stop); wg.Wait() }()

	// Sequential steps on the one SINGLE_ISSUER ring (t.Run would move
	// them to another thread).
	func() {
		w.PrepPoll(r.GetSQE(), wakeTag)
		start := time.Now()
		if _, err := r.SubmitAndWait(1, 200*time.Millisecond); !errors.Is(err, unix.ETIME) {
			t.Fatalf("got %v, want ETIME", err)
		}
		if el := time.Since(start); el < 200*time.Millisecond {
			t.Errorf("returned after %v", el)
		}
	}()
	func() {
		cqes := make([]CQE, 16)
		for i := range 2000 {
			s := r.GetSQE()
			s.PrepRead(int32(f.Fd()), bufs.Slot(i%16), uint64(i%16)*blk)
			s.UserData = uint64(i)
			for got := false; !got; {
				if _, err := r.SubmitAndWait(1, 0); err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				for _, c := range cqes[:r.Reap(cqes)] {
					if c.UserData == uint64(i) {
						got = true
						if c.Res != blk {
							t.Fatalf("read %d res %d", i, c.Res)
						}
					}
				}
			}
		}
	}()
	t.Logf("EINTR retried %d times, %d enters", r.intrs, r.Enters())
}
