package uring

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockThread pins the test goroutine to its thread (SINGLE_ISSUER rings
// belong to their creator) for the rest of the test.
func lockThread(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
}

func newRing(t *testing.T, cfg Config) *Ring {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// waitOne submits what is prepared and returns the next CQE, failing the
// test after a deadline.
func waitOne(t *testing.T, r *Ring) CQE {
	t.Helper()
	buf := make([]CQE, 1)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := r.SubmitAndWait(1, time.Second); err != nil && !errors.Is(err, unix.ETIME) {
			t.Fatalf("SubmitAndWait: %v", err)
		}
		if r.Reap(buf) == 1 {
			return buf[0]
		}
	}
	t.Fatal("no completion within 10s")
	return CQE{}
}

// directFile creates a file of size bytes in t.TempDir opened O_DIRECT.
func directFile(t *testing.T, size int64) *os.File {
	t.Helper()
	name := filepath.Join(t.TempDir(), "data")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatalf("open O_DIRECT: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func newBuffers(t *testing.T, n, size int) *Buffers {
	t.Helper()
	b, err := NewBuffers(n, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
