package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestServerStartFailureStopsDevice proves that a device whose creation
// fails after its START_DEV succeeded (issue 23, defect 7) is removed as
// the started device it is: STOP_DEV ends its queues, and only then are
// /dev/ublkcN closed and DEL_DEV sent. The Attach fails with the
// injected error and leaves no device, state file or queue behind, and the
// next Attach of the volume serves it.
func TestServerStartFailureStopsDevice(t *testing.T) {
	needUblk(t)
	ctx := context.Background()
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 64<<20)
	stateDir := filepath.Join(dir, "state")
	s, errs, err := NewServer(ctx, ServerConfig{StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range errs {
		t.Errorf("start-up: %v", e)
	}
	injected := errors.New("injected failure after START_DEV")
	var id uint32
	var started bool
	var atDelete []string
	setFailpoint(t, func(name string) error {
		switch {
		case name == fpStarted:
			sts, err := States(stateDir)
			if err != nil || len(sts) != 1 {
				t.Errorf("at START_DEV: states %+v, %v", sts, err)
				return injected
			}
			id, started = sts[0].DevID, true
			if _, err := os.Stat(blockPath(id)); err != nil {
				t.Errorf("started device has no block device: %v", err)
			}
			return injected
		case name == fpDeleting && started:
			// The kernel must have stopped the device before DEL_DEV.
			if info, err := s.Control().GetDevInfo(id); err != nil || info.State != StateDead {
				atDelete = append(atDelete, fmt.Sprintf("state %d (%v), want %d (stopped)", info.State, err, StateDead))
			}
			if _, err := os.Stat(blockPath(id)); !errors.Is(err, os.ErrNotExist) {
				atDelete = append(atDelete, fmt.Sprintf("%s still there (%v)", blockPath(id), err))
			}
		}
		return nil
	})
	_, err = s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file, Queues: 2})
	setFailpoint(t, nil)
	if !errors.Is(err, injected) {
		t.Fatalf("attach = %v, want the injected failure", err)
	}
	if !started {
		t.Fatal("the failpoint after START_DEV was not reached")
	}
	if len(atDelete) > 0 {
		t.Errorf("device %d at DEL_DEV: %v", id, atDelete)
	}
	waitGone(t, s.Control(), id)
	if sts, err := States(stateDir); err != nil || len(sts) != 0 {
		t.Errorf("state left: %+v, %v", sts, err)
	}
	if th := s.Threads(); th != nil {
		for _, st := range th.Stats() {
			if st.Queues != 0 || st.Err != nil {
				t.Errorf("server thread %d: %d queues left, error %v", st.ID, st.Queues, st.Err)
			}
		}
	}
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file, Queues: 2})
	if err != nil {
		t.Fatalf("attach after the failure: %v", err)
	}
	writeRead(t, d.Path, 0, 0x17, true)
	if err := s.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
}

// TestServerFailedRecoveryKeepsFilesOfLiveQueues proves that a re-adoption
// that fails after the device's queues started on the shared threads
// (here before END_USER_RECOVERY) ends them where the driver can
// (QUIESCE_DEV, Linux 6.16+), and the device is re-adopted by the next
// Attach with its data; where it cannot (6.12), the queues go on using
// /dev/ublkcN and the backing file, so both stay open (before, the backing
// file was closed under them, its fd number free for any other file) and
// health fails until the restarted plugin re-adopts the device.
func TestServerFailedRecoveryKeepsFilesOfLiveQueues(t *testing.T) {
	feats := needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 16<<20)
	state := filepath.Join(dir, "state")
	ctx := context.Background()
	s1 := newTestServer(t, state)
	d, err := s1.Attach(ctx, AttachSpec{VolumeID: "vol", File: file})
	if err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 0, 5, true)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected recovery failure")
	setFailpoint(t, func(name string) error {
		if name == fpRecovering {
			return injected
		}
		return nil
	})
	s2, errs, err := NewServer(ctx, ServerConfig{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	setFailpoint(t, nil)
	if len(errs) != 1 || !errors.Is(errs[0], injected) {
		t.Fatalf("start-up errors %v, want the injected failure", errs)
	}
	open := backingOpen(t, file)
	if feats&FlagQuiesce != 0 {
		if open {
			t.Error("backing file still open after its queues were ended")
		}
		if err := s2.Health(); err != nil {
			t.Errorf("health with nothing held: %v", err)
		}
		if _, err := s2.Attach(ctx, AttachSpec{VolumeID: "vol", File: file}); err != nil {
			t.Fatalf("re-adopt after the failed attempt: %v", err)
		}
		writeRead(t, d.Path, 0, 5, false)
		if err := s2.Detach(ctx, "vol"); err != nil {
			t.Fatal(err)
		}
		s2.Close()
		return
	}
	if !open {
		t.Error("backing file closed while the queues of the failed recovery still serve from it")
	}
	if err := s2.Health(); !errors.Is(err, errQueuesLive) {
		t.Errorf("Health = %v, want the held device", err)
	}
	s2.Close()
	s3 := newTestServer(t, state) // the restarted plugin
	defer s3.Close()
	writeRead(t, d.Path, 0, 5, false)
	if err := s3.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
}

// backingOpen reports whether the process holds path open.
func backingOpen(t *testing.T, path string) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}
