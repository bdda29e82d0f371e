package dataplane

import (
	"runtime"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// TestIOWQCapFollowsTheDeepestQueue checks, against the host kernel, that a
// thread's io-wq cap is the kernel's own plus the depth of the deepest
// queue attached, follows attaches and detaches, and that a cap set in the
// config stays as set.
func TestIOWQCapFollowsTheDeepestQueue(t *testing.T) {
	runtime.LockOSThread() // io-wq is per task
	defer runtime.UnlockOSThread()
	ring, err := uring.New(uring.Config{Entries: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	capNow := func() uint32 {
		t.Helper()
		v, err := ring.SetMaxWorkers(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return v[0]
	}
	kernel := capNow()
	if kernel == 0 {
		t.Fatal("the kernel reports no io-wq cap for a task with a ring")
	}
	s := &threadLoop{t: &Thread{}, ring: ring, slots: make([]*queueState, 3)}
	if err := s.initIOWQ(); err != nil {
		t.Fatal(err)
	}
	queue := func(depth uint16) *queueState { return &queueState{cfg: &QueueConfig{Depth: depth}} }
	for _, step := range []struct {
		name  string
		slots []*queueState
		want  uint32
	}{
		{"one queue of depth 32", []*queueState{queue(32), nil, nil}, kernel + 32},
		{"and one of depth 64", []*queueState{queue(32), nil, queue(64)}, kernel + 64},
		{"the deeper one detached", []*queueState{queue(32), nil, nil}, kernel + 32},
		{"none attached", []*queueState{nil, nil, nil}, kernel},
	} {
		copy(s.slots, step.slots)
		s.sizeIOWQ()
		if got := capNow(); got != step.want {
			t.Errorf("%s: io-wq cap %d, want %d (the kernel's %d)", step.name, got, step.want, kernel)
		}
	}

	fixed := &threadLoop{t: &Thread{cfg: ThreadConfig{IOWQWorkers: 5}}, ring: ring, slots: []*queueState{queue(64)}}
	if err := fixed.initIOWQ(); err != nil {
		t.Fatal(err)
	}
	fixed.sizeIOWQ()
	if got := capNow(); got != 5 {
		t.Errorf("with IOWQWorkers 5 and a queue of depth 64: io-wq cap %d, want 5", got)
	}
}
