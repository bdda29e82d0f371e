package ublk

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestServerSweepKeepsDeviceOfCorruptState proves that a state file the
// plugin cannot decode, or that decodes into a State that is not valid,
// does not get its live device deleted at start: the file is set aside
// and reported, the device stays quiesced with its I/O held, and Attach of
// that volume refuses rather than making a second device for the same
// file.
func TestServerSweepKeepsDeviceOfCorruptState(t *testing.T) {
	needUblk(t)
	for _, c := range []struct {
		name    string
		corrupt func(t *testing.T, saved []byte) []byte
	}{
		{"undecodable", func(*testing.T, []byte) []byte { return []byte(`{"volumeID": "vol", "devID": `) }},
		// Read as it is, the empty file would be a volume file that is
		// gone, and its device would be deleted.
		{"no-backing-file", func(t *testing.T, saved []byte) []byte {
			var m map[string]any
			if err := json.Unmarshal(saved, &m); err != nil {
				t.Fatal(err)
			}
			m["file"] = ""
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := scratchDir(t)
			state := filepath.Join(dir, "state")
			file := sparseFile(t, dir, "vol.img", 16<<20)
			ctx := context.Background()
			s := newTestServer(t, state)
			d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			ctl := openTestCtl(t)
			t.Cleanup(func() { DeleteOwned(ctl, d.DevID, OwnerToken(state)) })
			saved, err := os.ReadFile(statePath(state, "vol"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(statePath(state, "vol"), c.corrupt(t, saved), 0o600); err != nil {
				t.Fatal(err)
			}

			s2, errs, err := NewServer(ctx, ServerConfig{StateDir: state})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			t.Logf("start-up reported %v", errs)
			// The closed server's fds are released by the kernel's ring
			// exit work, after Close returns: the device may still be
			// live here and becomes quiesced soon after, unless the
			// sweep deleted it.
			waitState(t, ctl, d.DevID, StateQuiesced)
			if len(errs) == 0 {
				t.Error("start-up reported nothing about the unreadable state")
			}
			if q := s2.Quarantined(); len(q) != 1 {
				t.Errorf("Quarantined = %q, want the state file of vol", q)
			}
			_, err = s2.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
			if !errors.Is(err, os.ErrExist) {
				t.Fatalf("attach of the volume whose state was set aside = %v, want an error wrapping os.ErrExist", err)
			}
			if l := s2.List(); len(l) != 0 {
				t.Fatalf("server serves %+v, want nothing", l)
			}
		})
	}
}

// TestServerSweepSkippedWhileStateUnreadable proves that the start-up sweep
// of owned devices no state names deletes nothing while any state file
// cannot be read (it might name them), and deletes such a device, never
// started, once every state is readable.
func TestServerSweepSkippedWhileStateUnreadable(t *testing.T) {
	needUblk(t)
	state, _, id := crashBeforeStart(t)
	ctl := openTestCtl(t)
	// The device is now unrecorded, and another state cannot be read.
	if err := os.Remove(statePath(state, "vol")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(statePath(state, "other"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("start-up reported %v", errs)
	s.Close()
	if _, err := ctl.GetDevInfo(id); err != nil {
		t.Fatalf("unrecorded device %d swept while a state file was unreadable: %v", id, err)
	}
	if err := os.Remove(statePath(state, "other")); err != nil {
		t.Fatal(err)
	}
	newTestServer(t, state).Close()
	waitGone(t, ctl, id)
}

// TestServerCrashBeforeStart kills the plugin after the state of a new
// device is durable and before START_DEV, then proves that a restart
// deletes the never-started device and that the retried Attach makes a
// working one.
func TestServerCrashBeforeStart(t *testing.T) {
	needUblk(t)
	state, file, dead := crashBeforeStart(t)
	ctl := openTestCtl(t)
	if info, err := ctl.GetDevInfo(dead); err != nil || info.State != StateDead {
		t.Fatalf("device %d after the crash: %+v, %v; want it never started", dead, info, err)
	}

	// The retried Attach after a restart (bounded: a device stuck in
	// recovery would make it wait).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, errs, err := NewServer(ctx, ServerConfig{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range errs {
		t.Errorf("start-up: %v", e)
	}
	waitGone(t, ctl, dead) // before Attach, which may reuse its id
	if sts, _ := States(state); len(sts) != 0 {
		t.Fatalf("restart kept the state of the never-started device: %+v", sts)
	}
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatalf("attach after the restart: %v", err)
	}
	writeRead(t, d.Path, 0, 0x44, true)
	if err := s.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
	if sts, _ := States(state); len(sts) != 0 {
		t.Fatalf("states left: %+v", sts)
	}
}

// crashBeforeStart runs a plugin that attaches volume "vol" and dies at
// fpStateSaved, and returns the state directory, the volume file and the
// recorded device, which the test's end deletes.
func crashBeforeStart(t *testing.T) (state, file string, id uint32) {
	t.Helper()
	dir := scratchDir(t)
	state = filepath.Join(dir, "state")
	file = sparseFile(t, dir, "vol.img", 16<<20)
	crashAt(t, fpStateSaved, state, "vol", file)
	sts, _ := States(state)
	if len(sts) != 1 {
		t.Fatalf("states after the crash: %+v", sts)
	}
	id = sts[0].DevID
	t.Cleanup(func() {
		if ctl, err := OpenControl(); err == nil {
			DeleteOwned(ctl, id, OwnerToken(state))
			ctl.Close()
		}
	})
	return state, file, id
}
