package dataplane

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// TestThreadsPick checks that a Threads pool applies SpreadQueues (pinned
// in tuning_test.go): a device's queues land on different threads. Host
// test: server threads need only io_uring.
func TestThreadsPick(t *testing.T) {
	p, err := NewThreads(3, ThreadConfig{CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ths, err := p.Pick(2, 64)
	if err != nil || ths[0] == ths[1] {
		t.Fatalf("pick(2 queues) = %v, %v: want two threads", ths, err)
	}
}

// TestThreadsPinnedOnePerCPU proves that Pin pins server thread i to the
// i-th CPU the process may use (--ublk-pin-threads), whatever the config's
// CPU (its zero value pinned every thread to CPU 0 before), and that
// without Pin no thread is pinned: the process's tasks allowed on exactly
// one CPU are counted before and after. Host test.
func TestThreadsPinnedOnePerCPU(t *testing.T) {
	cpus := AllowedCPUs()
	if len(cpus) < 2 {
		testgate.Skip(t, testgate.SMP, "%d usable CPUs: pinning is not observable", len(cpus))
	}
	pinned := func() map[int]int { // CPU -> tasks allowed only there
		out := map[int]int{}
		for _, task := range pinnedTasks() {
			if slices.Contains(cpus, task.cpu) {
				out[task.cpu]++
			}
		}
		return out
	}
	before := pinned()
	// gone waits until the threads of a closed pool have exited: the
	// kernel ends a locked goroutine's OS thread after Close returns.
	gone := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			now := pinned()
			if now[cpus[0]] == before[cpus[0]] && now[cpus[1]] == before[cpus[1]] {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("tasks pinned after the pool closed: %v, before: %v (tasks: %v)", now, before, pinnedTasks())
			}
		}
	}
	for _, cfg := range []ThreadConfig{{CPU: -1}, {CPU: -1, Pin: true}, {Pin: true}, {}} {
		gone()
		pin := cfg.Pin
		p, err := NewThreads(2, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := pinned()
		p.Close()
		for i, c := range cpus[:2] {
			want := before[c]
			if pin {
				want++
			}
			if got[c] != want {
				t.Errorf("%+v: %d tasks pinned to CPU %d (thread %d's), want %d", cfg, got[c], c, i, want)
			}
		}
	}
}

// pinnedTask is a task of the process allowed on one CPU only. io-wq
// workers (comm iou-wrk-*) inherit the affinity of the thread that made
// them and outlive it for a while.
type pinnedTask struct {
	tid, cpu int
	comm     string
}

func (p pinnedTask) String() string { return fmt.Sprintf("%d:%s@%d", p.tid, p.comm, p.cpu) }

// pinnedTasks lists the process's tasks allowed on one CPU only.
func pinnedTasks() []pinnedTask {
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []pinnedTask
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var set unix.CPUSet
		if unix.SchedGetaffinity(tid, &set) != nil || set.Count() != 1 {
			continue // gone, or not pinned
		}
		comm, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		for c := range 1024 {
			if set.IsSet(c) {
				out = append(out, pinnedTask{tid: tid, cpu: c, comm: strings.TrimSpace(string(comm))})
			}
		}
	}
	return out
}

// TestThreadsPickReserves proves that pick books the room of the queues it
// places before it returns: devices attached one after the other, or at
// once, see each other's queues (before, the booking waited for the queue
// to start, so two attaches picked the same least loaded thread), and a
// pool with no room left refuses. Host test.
func TestThreadsPickReserves(t *testing.T) {
	p, err := NewThreads(2, ThreadConfig{CPU: -1, Tags: 2 * QueueCost(64)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	picked := make([][]*Thread, 4)
	var wg sync.WaitGroup
	for i := range picked {
		wg.Go(func() {
			ths, err := p.Pick(1, 64)
			if err != nil {
				t.Errorf("pick %d: %v", i, err)
			}
			picked[i] = ths
		})
	}
	wg.Wait()
	for _, th := range p.Threads() {
		if got := th.load(); got != 2*QueueCost(64) {
			t.Errorf("thread %d: %d tags reserved after 4 one-queue picks on 2 threads, want %d", th.ID(), got, 2*QueueCost(64))
		}
	}
	if _, err := p.Pick(1, 64); !errors.Is(err, ErrThreadFull) {
		t.Errorf("pick on full threads = %v, want ErrThreadFull", err)
	}
}

// TestThreadWakeNotLostWithoutSQE proves that a wake handled while no SQE
// is free (submission and pending queues full) is not lost: the thread
// arms its eventfd poll again once an SQE is free, so a later Close still
// reaches it. Host test: the thread's loop runs on the test's locked
// goroutine over a small ring that the test fills with polls on an eventfd
// of its own, hands it the wake CQE there, then frees the ring and lets it
// serve. Before, the re-arm was dropped and the Close went unnoticed (the
// test's watchdog ends the wait).
func TestThreadWakeNotLostWithoutSQE(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	newWaker := func() *uring.Waker {
		w, err := uring.NewWaker()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	th := &Thread{cfg: ThreadConfig{Tags: 1, Queues: 1}, waker: newWaker(), done: make(chan struct{})}
	ring, err := uring.New(uring.Config{Entries: 2, CQEntries: 4, Flags: ringFlags, PendingEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := &threadLoop{t: th, ring: ring, cqes: make([]uring.CQE, 4), slots: make([]*queueState, 1), free: []uint16{0},
		bufSlots: newRangeAlloc(1)}
	defer s.close(nil)
	stray := encodeUD(udCmd, 1<<12-1, 0) // no queue's
	held := newWaker()
	polls := 0
	for sqe := ring.GetSQE(); sqe != nil; sqe = ring.GetSQE() {
		held.PrepPoll(sqe, stray)
		polls++
	}
	s.handle(&uring.CQE{UserData: encodeUD(udWake, 0, 0)}) // no SQE free for the re-arm
	held.Wake()
	for got := 0; got < polls; got += ring.Reap(s.cqes) {
		if _, err := ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatalf("reap the test's polls: %v", err)
		}
	}
	watchdog := newWaker()
	watchdog.PrepPoll(ring.GetSQE(), stray)
	go func() {
		time.Sleep(100 * time.Millisecond)
		th.stop()
	}()
	lost := time.AfterFunc(5*time.Second, func() {
		t.Error("the thread did not notice Close: the wake whose re-arm found no SQE free was lost")
		watchdog.Wake()
	})
	defer lost.Stop()
	if err := s.serve(); !errors.Is(err, ErrQueueStopped) {
		t.Fatalf("serve = %v, want ErrQueueStopped", err)
	}
}

// TestThreadsReplace proves that a failed server thread can be replaced in
// its pool: the new thread takes its number and serves (Pick chooses it),
// the pool counts every thread live again and reports no failure, and
// Replace refuses a thread that still runs and works no more after Close.
// Host test (-tags failpoint: the failure is a panic injected in the
// thread's loop).
func TestThreadsReplace(t *testing.T) {
	p, err := NewThreads(2, ThreadConfig{CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dead := p.Threads()[0]
	if _, err := p.Replace(dead); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("Replace of a running thread = %v, want os.ErrInvalid", err)
	}
	stop := failThread(t, dead)
	<-dead.Done()
	stop()
	if p.Live() != 1 || !errors.Is(p.Err(), ErrThreadDead) {
		t.Fatalf("after the failure: %d live, Err %v", p.Live(), p.Err())
	}
	nt, err := p.Replace(dead)
	if err != nil {
		t.Fatal(err)
	}
	if nt.ID() != dead.ID() || p.Threads()[0] != nt || p.Live() != 2 || p.Err() != nil {
		t.Fatalf("after Replace: thread %d in place 0 is %v, %d live, Err %v", nt.ID(), p.Threads()[0] == nt, p.Live(), p.Err())
	}
	if _, err := p.Replace(dead); err == nil {
		t.Fatal("a thread replaced already was replaced again")
	}
	ths, err := p.Pick(2, 64)
	if err != nil || (ths[0] != nt && ths[1] != nt) {
		t.Fatalf("Pick(2) = %v, %v: want the new thread among them", ths, err)
	}
	UnreserveAll(ths, 64)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := p.Replace(nt); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Replace after Close = %v, want ErrPoolClosed", err)
	}
}
