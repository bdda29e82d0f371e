//go:build failpoint

package ublk

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// The failpoints and test hooks of a test build (-tags failpoint);
// failpoint_off_test.go skips the tests that need them in other builds.

// crashExit is the exit status of a helper process killed at a failpoint.
const crashExit = 75

// TestMain lets a test run this binary again as a plugin process that dies
// at a failpoint: with FASTBLK_CRASH_AT set, reaching that point exits the
// process at once, as a kill would (no deferred call runs, the kernel
// closes the descriptors).
func TestMain(m *testing.M) {
	if at := os.Getenv("FASTBLK_CRASH_AT"); at != "" {
		failpoint = func(name string) error {
			if name == at {
				os.Exit(crashExit)
			}
			return nil
		}
	}
	os.Exit(m.Run())
}

// crashAt runs a plugin process that attaches the volume and dies at the
// failpoint, and fails the test unless it died there.
func crashAt(t *testing.T, point, stateDir, volume, file string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FASTBLK_CRASH_AT="+point, "FASTBLK_STATE_DIR="+stateDir,
		"FASTBLK_VOLUME="+volume, "FASTBLK_FILE="+file)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != crashExit {
		t.Fatalf("helper did not die at %s: %v\n%s", point, err, out)
	}
}

// setFailpoint sets the package's failpoint for the rest of the test.
func setFailpoint(t *testing.T, f func(name string) error) {
	t.Helper()
	failpoint = f
	t.Cleanup(func() { failpoint = nil })
}

// failThread makes th fail at its next round (dataplane.FailThread).
func failThread(t *testing.T, th *dataplane.Thread) (stop func()) {
	t.Helper()
	return dataplane.FailThread(th)
}

// bufPages returns, over the copy-mode queues of th, how many pages of
// their buffers are resident, how many are registered as fixed buffers,
// and the most registered for one tag.
func bufPages(t *testing.T, th *dataplane.Thread) (resident, registered, most int) {
	t.Helper()
	resident, registered, most, err := dataplane.BufferPages(th, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return resident, registered, most
}

// injectEAGAIN makes the next n backing completions of q read -EAGAIN.
func injectEAGAIN(t *testing.T, q *dataplane.Queue, n int32) {
	t.Helper()
	q.FaultEAGAIN(n)
}

// eagainLeft is how many injected -EAGAIN answers are still to come.
func eagainLeft(q *dataplane.Queue) int32 { return q.FaultsLeft() }
