package main

import (
	"context"
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
