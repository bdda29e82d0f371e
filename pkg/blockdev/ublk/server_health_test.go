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

// TestServerHealthFailsWhenThreadNotHealed proves that where the devices of
// a server thread that failed for real (a panic inside its loop) cannot be
// re-adopted in the process (here their re-adoption fails at fpHealing,
// before START_USER_RECOVERY), the server's health fails, naming the
// volume and why it was not re-adopted, and stays failed, so that the
// plugin's /healthz does not say ok over a hung volume and the kubelet
// restarts the plugin; and that the next server (the restarted plugin)
// re-adopts the device with its data and health is good again.
func TestServerHealthFailsWhenThreadNotHealed(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 32<<20)
	state := filepath.Join(dir, "state")
	refused := errors.New("re-adoption refused by the test")
	setFailpoint(t, func(name string) error {
		if name == fpHealing {
			return refused
		}
		return nil
	})
	reports := make(chan error, 16)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: state, Threads: 1,
		Report: func(err error, _ string, _ ...any) { reports <- err }})
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
	waitReport(t, reports, refused)
	herr := s.Health()
	if !errors.Is(herr, dataplane.ErrThreadDead) || !errors.Is(herr, refused) || !strings.Contains(herr.Error(), "vol") {
		t.Fatalf("Health = %v, want the volume's ErrThreadDead and why it was not re-adopted", herr)
	}
	if errors.Is(herr, ErrNoThread) || s.Threads().Live() != 1 {
		t.Fatalf("Health = %v with %d live threads: the failed thread was not replaced", herr, s.Threads().Live())
	}
	if err := s.Close(); err != nil && !errors.Is(err, dataplane.ErrThreadDead) {
		t.Fatalf("Close = %v", err)
	}
	readoptedByNextServer(t, state, "vol", d.Path, 3)
}

// readoptedByNextServer starts the next server (a restarted plugin) on
// state and checks that it re-adopts the volume's device: health is good,
// the data writeRead wrote at 0 with seed reads back; then it detaches it.
func readoptedByNextServer(t *testing.T, state, id, dev string, seed byte) {
	t.Helper()
	s := newTestServer(t, state)
	defer s.Close()
	if err := s.Health(); err != nil {
		t.Fatalf("health after the device was re-adopted: %v", err)
	}
	writeRead(t, dev, 0, seed, false)
	if err := s.Detach(context.Background(), id); err != nil {
		t.Fatal(err)
	}
}

// waitReport waits until the server reports an error that matches want
// (ServerConfig.Report, here sending to reports).
func waitReport(t *testing.T, reports <-chan error, want error) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case err := <-reports:
			t.Logf("reported: %v", err)
			if errors.Is(err, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no report of %v within a minute", want)
		}
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
