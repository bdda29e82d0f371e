package ublk

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestServerHealRetriesWhilePaused proves that the heal of a failed server
// thread waits for a pause instead of failing for good (issue 43 defect 5).
// The volume has a queue on each of two threads and is paused with a write
// held on each; thread 0 fails. Its device cannot be re-adopted while the
// live thread's queue holds a request (the kernel's quiesce, or QUIESCE_DEV,
// waits for it), and the pause lasts longer than one attempt's wait (10 s).
// Health must stay good meanwhile (a liveness probe must not restart the
// plugin in the middle of the snapshot's copy); once resumed, the device is
// re-adopted, both writes land, and health is good. Before, the heal gave
// up after its one attempt and health failed until the plugin restarted.
// Cost: about 15 s.
func TestServerHealRetriesWhilePaused(t *testing.T) {
	needUblk(t)
	if runtime.NumCPU() < 2 {
		testgate.Skip(t, testgate.SMP, "%d CPUs: the two writes may share a queue", runtime.NumCPU())
	}
	dir := scratchDir(t)
	ctx := context.Background()
	s, errs, err := NewServer(ctx, ServerConfig{StateDir: filepath.Join(dir, "state"), Threads: 2})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	defer s.Close()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: sparseFile(t, dir, "vol.img", 32<<20), Queues: 2, Depth: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Detach(ctx, "vol")
	resume, err := s.Pause(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	// A write from each CPU: blk-mq maps each CPU to one of the two
	// hardware queues, so each queue holds one.
	wrote := make(chan error, 2)
	for cpu := range 2 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				wrote <- err
				return
			}
			fd, err := unix.Open(d.Path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
			if err == nil {
				_, err = unix.Pwrite(fd, pattern(4096, byte(cpu+1)), int64(cpu)<<20)
				unix.Close(fd)
			}
			wrote <- err
		}()
	}
	time.Sleep(500 * time.Millisecond) // both writes held by the gate
	th := s.Threads().Threads()[0]
	stopFailing := failThread(t, th)
	<-th.Done()
	stopFailing()
	// Longer than one attempt's wait for the live queue to end.
	for end := time.Now().Add(nodeWait + 3*time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if err := s.Health(); err != nil {
			t.Fatalf("health failed while the heal waits for the pause: %v", err)
		}
	}
	resume()
	resumed = true
	err = poll(ctx, time.Minute, func() (bool, error) {
		sv := s.get("vol")
		return sv != nil && !sv.dev.servedBy(th) && sv.dev.Err() == nil, nil
	})
	if err != nil {
		t.Fatalf("not re-adopted after the resume: %v; health: %v", err, s.Health())
	}
	for range 2 {
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatalf("a held write failed: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a held write did not land within a minute of the resume")
		}
	}
	if err := s.Health(); err != nil {
		t.Fatalf("health after the heal: %v", err)
	}
}
