package ublk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRecoveryWaitsForQuiesced proves that a re-adoption sends
// START_USER_RECOVERY only to a device that is QUIESCED: one that stays
// LIVE (here, one this server still serves; after a failure, one whose
// quiesce waits for a request no server can answer) fails with
// ErrDeviceWedged within the wait, and is sent nothing that takes its
// mutex. Before, START_USER_RECOVERY was sent to it again and again, and on
// a wedged device each one blocked and left an io-wq worker behind.
func TestRecoveryWaitsForQuiesced(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	ctx := context.Background()
	s := newTestServer(t, filepath.Join(dir, "state"))
	defer s.Close()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "live", File: sparseFile(t, dir, "live.img", 16<<20)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Detach(ctx, "live")
	id := s.get("live").dev.ID()
	start := time.Now()
	err = startRecovery(ctx, s.Control(), id, time.Second)
	if !errors.Is(err, ErrDeviceWedged) {
		t.Fatalf("recovery of a LIVE device: %v, want ErrDeviceWedged", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the refusal took %v, want about the 1 s wait", took)
	}
	// The device still serves.
	f, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, r := alignedBuf(t, 4096), alignedBuf(t, 4096)
	fill(w, 7)
	if _, err := f.WriteAt(w, 8192); err != nil {
		t.Fatalf("write after the refusal: %v", err)
	}
	if _, err := f.ReadAt(r, 8192); err != nil || !bytes.Equal(w, r) {
		t.Fatalf("read after the refusal differs (err %v)", err)
	}
}
