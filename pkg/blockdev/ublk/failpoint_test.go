package ublk

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
)

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

// TestHelperProcess is not a test: run by crashAt, it serves as the plugin
// that attaches FASTBLK_VOLUME (file FASTBLK_FILE) in FASTBLK_STATE_DIR.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("FASTBLK_CRASH_AT") == "" {
		return // not a helper: run by crashAt only
	}
	ctx := context.Background()
	s, _, err := NewServer(ctx, ServerConfig{StateDir: os.Getenv("FASTBLK_STATE_DIR")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Attach(ctx, AttachSpec{VolumeID: os.Getenv("FASTBLK_VOLUME"), File: os.Getenv("FASTBLK_FILE")})
	t.Fatalf("attach returned (%v) instead of dying at %s", err, os.Getenv("FASTBLK_CRASH_AT"))
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
