package ublk

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestServerPauseHoldsWrites proves Server.Pause, on which a consistent
// snapshot of a raw block volume in use rests: once Pause returns, writers
// keep writing to the device but nothing reaches the backing file, which
// holds every write acknowledged before; resume lets the held writes
// through, and nothing is lost.
func TestServerPauseHoldsWrites(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 32<<20)
	s := newTestServer(t, filepath.Join(dir, "state"))
	defer s.Close()
	ctx := context.Background()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Detach(ctx, "vol")

	var acked atomic.Int64 // writes acknowledged
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			fd, err := unix.Open(d.Path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(fd)
			buf := pattern(4096, byte(w))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				buf[0] = byte(i)
				if _, err := unix.Pwrite(fd, buf, int64(w*1024+i%1024)*4096); err != nil {
					t.Error(err)
					return
				}
				acked.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)
	resume, err := s.Pause(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	before, n := fileSum(t, file), acked.Load()
	time.Sleep(500 * time.Millisecond)
	after, m := fileSum(t, file), acked.Load()
	resume()
	if before != after {
		t.Fatal("the backing file changed while the device was paused")
	}
	if m > n+4 { // at most the writes whose completion was on its way
		t.Fatalf("%d writes acknowledged while paused", m-n)
	}
	time.Sleep(300 * time.Millisecond)
	if acked.Load() <= m {
		t.Fatal("no write went through after resume")
	}
	t.Logf("%d writes before the pause, %d during, %d after resume", n, m-n, acked.Load()-m)
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestServerHealsFailedThreadUnderPause proves the in-process heal of a
// server thread that fails for real (a panic inside its loop) with the one
// device it served paused: the device is re-adopted onto the thread started
// in its place without a new server, and the pause goes on across it (a
// write after the heal reaches nothing until resume: a snapshot copied
// under the pause stays consistent); resume lets the held write through
// (it woke only the old device's queues before: the write hung), the data
// written before the failure reads back, and health is good.
func TestServerHealsFailedThreadUnderPause(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 32<<20)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: filepath.Join(dir, "state"), Threads: 1})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	defer s.Close()
	ctx := context.Background()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Detach(ctx, "vol")
	writeRead(t, d.Path, 1<<20, 7, true)
	resume, err := s.Pause(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	before := fileSum(t, file)
	th := s.Threads().Threads()[0]
	stopFailing := failThread(t, th)
	defer stopFailing()
	<-th.Done()
	stopFailing()
	err = poll(ctx, time.Minute, func() (bool, error) { return healed(s), nil })
	if err != nil {
		t.Fatalf("not healed: %v; health: %v", err, s.Health())
	}
	if s.Threads().Threads()[0] == th || s.Threads().Live() != 1 {
		t.Fatal("the failed thread was not replaced")
	}
	wrote := make(chan error, 1)
	go func() {
		fd, err := unix.Open(d.Path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Pwrite(fd, pattern(64<<10, 9), 4<<20)
			unix.Close(fd)
		}
		wrote <- err
	}()
	time.Sleep(300 * time.Millisecond) // the write has had time to go through
	select {
	case err := <-wrote:
		t.Fatalf("a write went through the pause after the heal (%v)", err)
	default:
	}
	if fileSum(t, file) != before {
		t.Fatal("the backing file changed under the pause across the heal")
	}
	resume()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the write held by the pause: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the write held by the pause did not complete after resume")
	}
	writeRead(t, d.Path, 1<<20, 7, false) // the data written before the failure
	writeRead(t, d.Path, 2<<20, 8, true)  // and new I/O
	if err := s.Err("vol"); err != nil {
		t.Fatalf("healed device: %v", err)
	}
}
