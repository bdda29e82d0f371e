package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUblkServeRejectsMaxIOAboveLimit proves that --max-io is checked
// before it is narrowed to the kernel's 32-bit field: 4 GiB + 4 KiB would
// otherwise wrap to a valid 4 KiB and serve with the wrong request size.
// The check runs before any device is touched, so no ublk is needed.
func TestUblkServeRejectsMaxIOAboveLimit(t *testing.T) {
	for _, v := range []string{"2097152", "4294971392"} {
		err := ublkServe(context.Background(), []string{"--file", "/nonexistent", "--max-io", v})
		if err == nil || !strings.Contains(err.Error(), "--max-io") {
			t.Errorf("--max-io %s: err = %v, want a --max-io error", v, err)
		}
	}
}

// TestUblkListChangesNothing proves that `ublk list` only reads the node:
// pointed at a data directory that does not exist, or exists empty, it
// creates nothing there (no directory, no owner token) and does not fail for
// its sake; the only failure allowed is a kernel without ublk. Before, it
// created the owner token, and failed where the directory was missing
// ("owner token: ... no such file or directory").
func TestUblkListChangesNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		exist bool
	}{{"missing", false}, {"empty", true}} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if c.exist {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			err := ublkList([]string{"--data-dir", dir})
			if err != nil && !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("ublk list of a data directory without an owner: %v", err)
			}
			ents, rerr := os.ReadDir(dir)
			switch {
			case !c.exist && !errors.Is(rerr, os.ErrNotExist):
				t.Errorf("ublk list created %s (%v)", dir, rerr)
			case c.exist && (rerr != nil || len(ents) != 0):
				t.Errorf("ublk list wrote into %s: %v, %v", dir, ents, rerr)
			}
		})
	}
}
