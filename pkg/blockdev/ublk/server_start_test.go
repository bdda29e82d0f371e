package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// setFailpoint sets the package's failpoint for the rest of the test.
func setFailpoint(t *testing.T, f func(name string) error) {
	t.Helper()
	failpoint = f
	t.Cleanup(func() { failpoint = nil })
}

// TestServerStartFailureStopsDevice proves that a device whose creation
// fails after its START_DEV succeeded (issue 23, defect 7) is removed as
// the started device it is: STOP_DEV ends its queues, and only then are
// /dev/ublkcN closed and DEL_DEV sent. Checked with a thread per queue
// (ServerConfig.ThreadPerQueue), where a teardown that took the device for
// never started only closed the queues' rings and left it live or quiesced
// until DEL_DEV, and on shared server threads. The Attach fails with the
// injected error and leaves no device, state file or queue behind, and the
// next Attach of the volume serves it.
func TestServerStartFailureStopsDevice(t *testing.T) {
	needUblk(t)
	for _, perQueue := range []bool{true, false} {
		name := map[bool]string{true: "thread per queue", false: "shared threads"}[perQueue]
		t.Run(name, func(t *testing.T) { testStartFailure(t, perQueue) })
	}
}

func testStartFailure(t *testing.T, perQueue bool) {
	ctx := context.Background()
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 64<<20)
	stateDir := filepath.Join(dir, "state")
	s, errs, err := NewServer(ctx, ServerConfig{StateDir: stateDir, ThreadPerQueue: perQueue})
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
	failpoint = nil
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
