// Package testgate is the one place tests decide what to do when the
// machine lacks something they need (root, ublk, a ublk feature): skip
// where that is expected (the host has no ublk), fail where it is not.
//
// FASTBLK_REQUIRE lists, comma-separated, the features that must be
// present; a test that would skip or narrow its coverage for lack of one of
// them fails instead. The VM harness sets it from the kernel it boots
// (hack/vm/guest/lib.sh), so that on Linux 7.3 the zero-copy, batch,
// UPDATE_SIZE and QUIESCE tests cannot pass by not running. "all" requires
// every feature.
package testgate

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// The features tests gate on.
const (
	Root       = "root"       // euid 0
	Ublk       = "ublk"       // /dev/ublk-control (ublk_drv loaded)
	ZeroCopy   = "zerocopy"   // UBLK_F_AUTO_BUF_REG
	BatchIO    = "batch"      // UBLK_F_BATCH_IO
	UpdateSize = "updatesize" // UBLK_F_UPDATE_SIZE
	Quiesce    = "quiesce"    // UBLK_F_QUIESCE
)

// EnvRequire is the environment variable listing the required features.
const EnvRequire = "FASTBLK_REQUIRE"

// Required reports whether FASTBLK_REQUIRE lists feature (or "all").
func Required(feature string) bool {
	list := strings.Split(os.Getenv(EnvRequire), ",")
	for i := range list {
		list[i] = strings.TrimSpace(list[i])
	}
	return slices.Contains(list, feature) || slices.Contains(list, "all")
}

// Skip skips t for lack of feature, or fails it when feature is required.
func Skip(t testing.TB, feature, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required(feature) {
		t.Fatalf("%s is required here (%s=%s) but missing: %s", feature, EnvRequire, os.Getenv(EnvRequire), why)
	}
	t.Skip(why)
}

// Without records that t runs without the part of its coverage that needs
// feature: logged, or a failure when feature is required.
func Without(t testing.TB, feature, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required(feature) {
		t.Errorf("%s is required here (%s=%s) but missing: %s", feature, EnvRequire, os.Getenv(EnvRequire), why)
		return
	}
	t.Log(why)
}

// RequireRoot skips (or fails, see Skip) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, Root, "needs root")
	}
}

// UblkControl is the ublk driver's control device.
const UblkControl = "/dev/ublk-control"

// RequireUblk skips (or fails, see Skip) unless the test runs as root on
// a kernel with ublk_drv loaded.
func RequireUblk(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(UblkControl); err != nil {
		Skip(t, Ublk, "no %s (ublk_drv): run in the VM (hack/vm/run.sh)", UblkControl)
	}
}
