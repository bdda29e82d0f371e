package ublk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestServerHealthFailsWhileThreadFailed proves that a server thread that
// fails for real (a panic inside its loop) makes the server's health fail
// while its device holds the I/O, naming the volume, so that the plugin's
// /healthz does not say ok over a hung volume; and that the health is
// good again once the device is served (here by the next server).
func TestServerHealthFailsWhileThreadFailed(t *testing.T) {
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
	if err := s.Health(); err != nil {
		t.Fatalf("health of a served device: %v", err)
	}
	writeRead(t, d.Path, 0, 3, true)
	th := s.Threads().Threads()[0]
	stopFailing := failThread(t, th)
	defer stopFailing()
	<-th.Done()
	stopFailing()
	err = poll(ctx, 5*time.Second, func() (bool, error) { return s.Health() != nil, nil })
	if err != nil {
		t.Fatalf("health says ok while the device of a failed thread holds its i/o: %v", err)
	}
	herr := s.Health()
	if !errors.Is(herr, dataplane.ErrThreadDead) || !strings.Contains(herr.Error(), "vol") || !errors.Is(herr, ErrNoThread) {
		t.Fatalf("Health = %v, want the volume's ErrThreadDead and ErrNoThread", herr)
	}
	if err := s.Close(); !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Close = %v", err)
	}
	s2 := newTestServer(t, state)
	defer s2.Close()
	if err := s2.Health(); err != nil {
		t.Fatalf("health after the device was re-adopted: %v", err)
	}
	writeRead(t, d.Path, 0, 3, false)
	if err := s2.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
}

// TestServerControlNotBlockedByStuckCommand proves that a control command
// that waits (a synchronous DEL_DEV of a device whose block device is
// still open waits for the last reference, up to its 10 s timeout) holds
// up no other command: GET_FEATURES answers meanwhile. Before, one mutex
// serialised every command, so it waited for the DEL_DEV's timeout.
func TestServerControlNotBlockedByStuckCommand(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 16<<20)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: filepath.Join(dir, "state"), Threads: 1})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	d, err := s.Attach(context.Background(), AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(d.Path)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Control()
	if err := c.StopDev(d.DevID); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- c.DelDev(d.DevID, false) }()
	time.Sleep(200 * time.Millisecond) // the DEL_DEV is in the kernel, waiting
	start := time.Now()
	if _, err := c.GetFeatures(); err != nil {
		t.Errorf("get features beside a waiting DEL_DEV: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("get features took %v beside a waiting DEL_DEV: control commands are serialised", took)
	}
	holder.Close()
	s.Close() // releases /dev/ublkcN, the DEL_DEV's last reference
	if err := <-deleted; err != nil {
		t.Logf("DEL_DEV: %v", err)
	}
	c2, err := OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := deleteDev(c2, d.DevID); err != nil {
		t.Errorf("delete device: %v", err)
	}
}
