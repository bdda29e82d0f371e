package ublk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestServerReadopt closes a server (devices stay, quiesced) and checks a
// new one re-adopts the device with its data and serves I/O again: per tag
// in the default copy mode; in the kernel's copy mode at 128 KiB, as every
// server before user copy made devices on kernels without zero copy (an
// upgrade must take them over as they are); with user copy, which the
// device keeps although the new server is told not to use it; and, where
// the kernel has it, in batch mode, which the device keeps although the
// new server would create devices without it.
func TestServerReadopt(t *testing.T) {
	needUblk(t)
	f := features(t, openTestCtl(t))
	modes := map[string]ServerConfig{"per-tag": {BatchIO: ModeOff},
		"copy mode before user copy": {BatchIO: ModeOff, ZeroCopy: ModeOff, UserCopy: ModeOff}}
	if f&FlagUserCopy != 0 {
		modes["user copy"] = ServerConfig{BatchIO: ModeOff, ZeroCopy: ModeOff, UserCopy: ModeOn}
	} else {
		testgate.Without(t, testgate.UserCopy, "kernel has no USER_COPY: re-adoption with user copy not tested")
	}
	if f&FlagBatchIO != 0 {
		modes["batch"] = ServerConfig{BatchIO: ModeOn}
	} else {
		testgate.Without(t, testgate.BatchIO, "kernel has no BATCH_IO: re-adoption in batch mode not tested")
	}
	for name, cfg := range modes {
		t.Run(name, func(t *testing.T) { testReadopt(t, cfg) })
	}
}

func testReadopt(t *testing.T, cfg ServerConfig) {
	dir := scratchDir(t)
	state := filepath.Join(dir, "state")
	file := sparseFile(t, dir, "vol.img", 64<<20)
	ctx := context.Background()
	cfg.StateDir = state
	s, errs, err := NewServer(ctx, cfg)
	if err != nil || len(errs) != 0 {
		t.Fatalf("start: %v, %v", err, errs)
	}
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	batched := d.Flags&FlagBatchIO != 0
	if batched != (cfg.BatchIO == ModeOn) {
		t.Fatalf("device flags %s with batch i/o %s", FormatFlags(d.Flags), cfg.BatchIO)
	}
	switch {
	case cfg.UserCopy == ModeOff && (d.Tuning.CopyMode() != "copy" || d.Tuning.MaxIOBytes != DefaultMaxIOBytes):
		t.Fatalf("user copy off: device %s with %d-byte requests, want the kernel's copy mode at %d", d.Tuning.CopyMode(), d.Tuning.MaxIOBytes, DefaultMaxIOBytes)
	case cfg.UserCopy == ModeOn && (d.Tuning.CopyMode() != "user-copy" || d.Flags&FlagUserCopy == 0):
		t.Fatalf("user copy on: device %s, flags %s", d.Tuning.CopyMode(), FormatFlags(d.Flags))
	}
	writeRead(t, d.Path, 0, 0x11, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctl, err := OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	waitState(t, ctl, d.DevID, StateQuiesced)

	// The restarted plugin is told the opposite of the recorded NOWAIT
	// choice: an explicit on or off applies to re-adopted devices too.
	// It is told the opposite of user copy too, which applies to new
	// devices only.
	flip := ModeOn
	if d.NowaitWrites {
		flip = ModeOff
	}
	uc := ModeAuto
	if cfg.UserCopy == ModeOn {
		uc = ModeOff
	}
	s2, errs, err := NewServer(ctx, ServerConfig{StateDir: state, NowaitWrites: flip, UserCopy: uc})
	if err != nil || len(errs) != 0 {
		t.Fatalf("restart: %v, %v", err, errs)
	}
	defer func() {
		if err := s2.Detach(ctx, "vol"); err != nil {
			t.Errorf("detach: %v", err)
		}
		s2.Close()
	}()
	list := s2.List()
	if len(list) != 1 || list[0].Path != d.Path {
		t.Fatalf("re-adopted %+v, want %s", list, d.Path)
	}
	if list[0].Flags != d.Flags || list[0].Tuning != d.Tuning {
		t.Errorf("re-adopted with flags %s and %+v, created with %s and %+v", FormatFlags(list[0].Flags), list[0].Tuning,
			FormatFlags(d.Flags), d.Tuning)
	}
	if kb := maxSectorsKB(t, d.Path); kb != int(d.Tuning.MaxIOBytes>>10) {
		t.Errorf("re-adopted device takes %d KiB requests, its record says %d", kb, d.Tuning.MaxIOBytes>>10)
	}
	if list[0].NowaitWrites == d.NowaitWrites {
		t.Errorf("re-adopted with --nowait-writes %s: NowaitWrites %v, want %v", flip, list[0].NowaitWrites, !d.NowaitWrites)
	}
	if info, err := ctl.GetDevInfo(d.DevID); err != nil || info.State != StateLive || int(info.UblksrvPID) != os.Getpid() {
		t.Fatalf("after recovery: %+v, %v", info, err)
	}
	writeRead(t, d.Path, 0, 0x11, false)
	writeRead(t, d.Path, 8<<20, 0x22, true)
}

// TestServerSweep deletes the device of a volume whose file is gone, and
// leaves a device owned by another state directory alone.
func TestServerSweep(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	ctx := context.Background()
	gone := sparseFile(t, dir, "gone.img", 16<<20)
	s := newTestServer(t, filepath.Join(dir, "state"))
	dg, err := s.Attach(ctx, AttachSpec{VolumeID: "gone", File: gone})
	if err != nil {
		t.Fatal(err)
	}
	other := newTestServer(t, filepath.Join(dir, "other"))
	defer other.Close()
	kept := sparseFile(t, dir, "kept.img", 16<<20)
	dk, err := other.Attach(ctx, AttachSpec{VolumeID: "kept", File: kept})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Detach(ctx, "kept")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	s2 := newTestServer(t, filepath.Join(dir, "state"))
	defer s2.Close()
	if l := s2.List(); len(l) != 0 {
		t.Fatalf("server lists %+v, want nothing", l)
	}
	ctl := s2.Control()
	waitGone(t, ctl, dg.DevID) // DEL_DEV_ASYNC: gone once the last reference drops
	if info, err := ctl.GetDevInfo(dk.DevID); err != nil || info.State != StateLive {
		t.Fatalf("other owner's device %d: %+v, %v; want it live", dk.DevID, info, err)
	}
}

// waitGone polls GET_DEV_INFO until the device no longer exists.
func waitGone(t *testing.T, ctl *Control, id uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := ctl.GetDevInfo(id)
		if errors.Is(err, unix.ENODEV) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %d still there: %+v, %v", id, info, err)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// waitState polls GET_DEV_INFO until the device reaches want.
func waitState(t *testing.T, ctl *Control, id uint32, want DevState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := ctl.GetDevInfo(id)
		if err == nil && info.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %d: %+v, %v; want state %d", id, info, err, want)
		}
		<-time.After(10 * time.Millisecond)
	}
}
