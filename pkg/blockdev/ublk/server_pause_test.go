package ublk

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
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

// TestServerRecoversDevicesOfFailedThread proves the recovery path of a
// server thread that fails: its devices report the failure at once
// (Server.Err), their I/O is held, not failed, and the next server (the
// restarted plugin) re-adopts them through user recovery with their data.
func TestServerRecoversDevicesOfFailedThread(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 32<<20)
	state := filepath.Join(dir, "state")
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: state, Threads: 1})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	ctx := context.Background()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 1<<20, 7, true)
	th := s.Threads().Threads()[0]
	stopFailing := failThread(t, th)
	defer stopFailing()
	err = poll(ctx, 5*time.Second, func() (bool, error) { return s.Err("vol") != nil, nil })
	if err != nil {
		t.Fatalf("the device of a failed thread does not report it: %v", err)
	}
	if err := s.Err("vol"); !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Server.Err = %v, want ErrThreadDead", err)
	}
	stopFailing()
	if err := s.Close(); !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Close = %v, want the thread's failure reported", err)
	}
	s2 := newTestServer(t, state)
	defer s2.Close()
	if err := s2.Err("vol"); err != nil {
		t.Fatalf("re-adopted device: %v", err)
	}
	writeRead(t, d.Path, 1<<20, 7, false) // the data written before the failure
	writeRead(t, d.Path, 2<<20, 8, true)  // and new I/O
	if err := s2.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
}
