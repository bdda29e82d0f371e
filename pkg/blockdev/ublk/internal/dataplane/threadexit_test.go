//go:build failpoint

package dataplane

import (
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFailedThreadExitsBeforeItsRingCloses proves that a server thread that
// fails closes its ring only once its OS thread has exited (issue 43 defect
// 1). While the thread lives, a ublk request whose dispatch the ring's exit
// left as task work of that thread would run there and be handed to the
// closed ring, owned by no one for good; once the thread is gone, the
// driver aborts such a dispatch (the daemon task is not current), as it
// does for a server that crashed.
func TestFailedThreadExitsBeforeItsRingCloses(t *testing.T) {
	th, err := NewThread(0, ThreadConfig{Tags: 64, Queues: 2, CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	var tid atomic.Int32
	setRoundHook(func(s *threadLoop) {
		if s.t == th {
			tid.Store(int32(unix.Gettid()))
			panic("injected failure")
		}
	})
	defer setRoundHook(nil)
	alive := make(chan bool, 1)
	setRingCloseHook(func(s *threadLoop) {
		if s.t == th {
			_, err := os.Stat("/proc/self/task/" + strconv.Itoa(int(tid.Load())))
			alive <- err == nil
		}
	})
	defer setRingCloseHook(nil)
	th.Wake()
	select {
	case <-th.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the failed thread did not end within 10 s")
	}
	if th.Err() == nil {
		t.Fatal("the thread ended without its failure")
	}
	if int(tid.Load()) == unix.Getpid() {
		t.Fatal("the server thread ran on the process's main thread, which never exits")
	}
	select {
	case a := <-alive:
		if a {
			t.Fatalf("the ring of server thread %d (tid %d) was closed while its OS thread still ran", th.ID(), tid.Load())
		}
	default:
		t.Fatal("Done was closed before the ring")
	}
}
