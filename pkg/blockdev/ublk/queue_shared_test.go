package ublk

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// testThread starts a server thread that the test closes at its end
// (after the queues' own cleanups, which run first).
func testThread(t *testing.T) *dataplane.Thread {
	t.Helper()
	return testThreadOf(t, ThreadConfig{})
}

// testThreadOf is testThread with cfg (its CPU set to none).
func testThreadOf(t *testing.T, cfg ThreadConfig) *dataplane.Thread {
	t.Helper()
	cfg.CPU = -1
	th, err := dataplane.NewThread(0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := th.Close(); err != nil && !errors.Is(err, dataplane.ErrThreadDead) {
			t.Errorf("close server thread: %v", err)
		}
	})
	return th
}

// TestSharedThreadServesManyDevices proves the design at node scale in
// miniature: one server thread serves the queues of six devices at once
// (copy mode and, where the driver has it, zero copy side by side in one
// buffer table), every device's data verifies under concurrent load, one
// wake-up reaps completions of several devices, and devices leave (STOP_DEV)
// without disturbing the others.
func TestSharedThreadServesManyDevices(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	const n, size = 6, 64 << 20
	type dev struct {
		d    *testDev
		qs   []*dataplane.Queue
		path string
		f    *os.File
	}
	devs := make([]dev, n)
	for i := range devs {
		var flags uint64
		if i%2 == 1 && features(t, c)&FlagAutoBufReg != 0 {
			flags = FlagAutoBufReg
		}
		f, _ := backingFile(t, size)
		d := addTestDev(t, c, 2, 32, 512<<10, flags, size)
		qs, path := startQueuesOn(t, d, FileTarget(int(f.Fd())), QueueOptions{FixedBuffers: true}, []*dataplane.Thread{th})
		devs[i] = dev{d, qs, path, f}
	}
	if st := th.Stats(); st.Queues != 2*n {
		t.Fatalf("thread serves %d queues, want %d", st.Queues, 2*n)
	}
	before := th.Stats()
	var wg sync.WaitGroup
	for _, d := range devs {
		wg.Go(func() { checkParallel(t, d.path) })
	}
	wg.Wait()
	after := th.Stats()
	enters, cqes := after.Enters-before.Enters, after.CQEs-before.CQEs
	t.Logf("%d devices on one thread: %d completions in %d waits (%.1f per wait)", n, cqes, enters, float64(cqes)/float64(max(enters, 1)))
	if enters == 0 || cqes <= enters {
		t.Fatalf("%d completions in %d waits: the thread did not reap several per wake-up", cqes, enters)
	}
	// Half the devices leave; the others go on serving.
	for _, d := range devs[:n/2] {
		if err := d.d.stop(); err != nil {
			t.Fatal(err)
		}
		for _, q := range d.qs {
			if err := q.Wait(); err != nil {
				t.Fatalf("queue after STOP_DEV: %v", err)
			}
		}
	}
	if st := th.Stats(); st.Queues != n || st.Tags != n*dataplane.QueueCost(32) {
		t.Fatalf("after %d devices left the thread serves %d queues, %d tags; want %d, %d", n/2, st.Queues, st.Tags, n, n*dataplane.QueueCost(32))
	}
	for _, d := range devs[n/2:] {
		checkReadWrite(t, d.path, d.f)
	}
}

// TestSharedThreadStopsUnstartedDevice proves that STOP_DEV ends the queues
// of a device that never started (a failed creation): on a shared thread
// nothing else could take their parked FETCHes back.
func TestSharedThreadStopsUnstartedDevice(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	f, _ := backingFile(t, 16<<20)
	d := addTestDev(t, c, 2, 16, 128<<10, 0, 16<<20)
	var qs []*dataplane.Queue
	for qid := range d.info.NrHWQueues {
		q, err := dataplane.StartQueue(dataplane.QueueConfig{DevID: d.info.DevID, QID: qid, Depth: d.info.QueueDepth, CharFD: d.charFD,
			Flags: d.info.Flags, MaxIOBytes: d.info.MaxIOBufBytes, Thread: th, Target: FileTarget(int(f.Fd()))})
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	if err := c.StopDev(d.info.DevID); err != nil {
		t.Fatalf("STOP_DEV of an unstarted device: %v", err)
	}
	for _, q := range qs {
		select {
		case <-q.Done():
			if err := q.Wait(); err != nil {
				t.Fatalf("queue after STOP_DEV: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("STOP_DEV did not end the queues of an unstarted device")
		}
	}
	if st := th.Stats(); st.Queues != 0 {
		t.Fatalf("thread still serves %d queues", st.Queues)
	}
}

// TestSharedThreadIsFair proves that a device held back by its rate limit,
// with a backlog of requests waiting, does not starve another device on
// the same thread: the other's requests go through at their own pace.
func TestSharedThreadIsFair(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	const size = 16 << 20
	slowF, _ := backingFile(t, size)
	slow := addTestDev(t, c, 1, 32, 128<<10, 0, size)
	lim := qos.New(qos.Limits{IOPS: 50})
	sq, err := dataplane.StartQueue(dataplane.QueueConfig{DevID: slow.info.DevID, Depth: 32, CharFD: slow.charFD, Flags: slow.info.Flags,
		MaxIOBytes: slow.info.MaxIOBufBytes, Thread: th, Target: FileTarget(int(slowF.Fd())), Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	slowPath := slow.start(t)
	t.Cleanup(func() { slow.stop(); sq.Wait() })
	fastF, _ := backingFile(t, size)
	fast := addTestDev(t, c, 1, 32, 128<<10, 0, size)
	_, fastPath := startQueuesOn(t, fast, FileTarget(int(fastF.Fd())), QueueOptions{}, []*dataplane.Thread{th})
	bd, err := os.OpenFile(fastPath, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	buf := alignedBuf(t, 4096)
	// 200 reads at queue depth 1 on the unlimited device, alone first.
	reads := func() time.Duration {
		start := time.Now()
		for i := range 200 {
			if _, err := bd.ReadAt(buf, int64(i)*4096); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	alone := reads()

	// 32 readers keep the slow device's queue full of held requests.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			bd, err := os.OpenFile(slowPath, os.O_RDONLY|unix.O_DIRECT, 0)
			if err != nil {
				return
			}
			defer bd.Close()
			buf := alignedBuf(t, 4096)
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				bd.ReadAt(buf, int64((i*64+j%64)*4096))
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	err = poll(t.Context(), 30*time.Second, func() (bool, error) { return sq.Stats().InFlight >= 16, nil })
	if err != nil {
		t.Fatalf("slow device not backlogged: %v, %+v", err, sq.Stats())
	}
	// At the slow device's 50 IOPS the reads would take 4 s; served
	// fairly they take about as long as alone. Starving shows as the
	// limiter's pace, so a host slowed down by other work (the timings
	// under emulation move by 2x and more) fails only when the reads
	// also come near that pace.
	beside := reads()
	t.Logf("200 reads on the unlimited device: %v alone, %v while the limited one holds %d requests", alone, beside, sq.Stats().InFlight)
	if beside > 2*alone+500*time.Millisecond && beside > 2500*time.Millisecond {
		t.Fatalf("200 reads took %v beside the backlog, %v alone: the limited device's backlog slowed its neighbour", beside, alone)
	}
}

// TestThreadFailureSurfaces proves that a server thread that fails (a
// panic, injected here) is noticed at once: every queue it served ends with
// ErrThreadDead, Queue.Err and the thread's Err say why, and the ring's
// close, with /dev/ublkcN released, leaves a device with user recovery
// QUIESCED, its I/O held, not failed.
func TestThreadFailureSurfaces(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	f, _ := backingFile(t, 16<<20)
	d := addTestDev(t, c, 2, 16, 128<<10, FlagUserRecovery|FlagUserRecoveryReissue, 16<<20)
	qs, _ := startQueuesOn(t, d, FileTarget(int(f.Fd())), QueueOptions{}, []*dataplane.Thread{th})
	stopFailing := failThread(t, th)
	t.Cleanup(stopFailing)
	for _, q := range qs {
		select {
		case <-q.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("queue of a failed thread still runs")
		}
		if err := q.Wait(); !errors.Is(err, dataplane.ErrThreadDead) {
			t.Fatalf("queue ended with %v, want ErrThreadDead", err)
		}
		if err := q.Err(); !errors.Is(err, dataplane.ErrThreadDead) {
			t.Fatalf("Queue.Err = %v, want ErrThreadDead", err)
		}
	}
	<-th.Done() // it ends its queues first, then itself
	if err := th.Err(); !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Thread.Err = %v, want ErrThreadDead", err)
	}
	// The server releases the device's /dev/ublkcN once its queues are
	// gone (Device.Release); Linux 7.x quiesces the device only then.
	unix.Close(d.charFD)
	d.charFD = -1
	err := poll(t.Context(), 5*time.Second, func() (bool, error) {
		info, err := c.GetDevInfo(d.info.DevID)
		return err == nil && info.State == StateQuiesced, err
	})
	if err != nil {
		t.Fatalf("device not QUIESCED after its thread failed: %v", err)
	}
	stopFailing()
	// Close of a failed thread reports its failure (so testThread's
	// cleanup lets ErrThreadDead pass).
	if err := th.Close(); !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Close of the failed thread = %v", err)
	}
}
