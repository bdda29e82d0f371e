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
