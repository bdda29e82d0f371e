package ublk

import (
	"context"
	"os"
	"testing"
)

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
