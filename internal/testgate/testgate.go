// Package testgate is the one place tests decide what to do when the
// machine lacks something they need (root, loop devices, a tool, ublk, a
// ublk feature, or an opt-in such as a cluster): skip where that is
// expected (the host has no ublk), fail where it is not. No test calls
// t.Skip itself.
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
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The features tests gate on: what a machine provides. make test requires
// those of the machines it runs on (Makefile, hack/vm/guest/lib.sh).
const (
	Root        = "root"        // euid 0
	Loop        = "loop"        // loop devices (/dev/loop-control)
	Tools       = "tools"       // mkfs.ext4, mkfs.xfs and the programs make deps installs
	Cgroup      = "cgroup"      // a pids controller that root may create child cgroups under
	IOAcct      = "ioacct"      // per-task I/O accounting (write_bytes in /proc/self/io)
	Ext4Error   = "ext4error"   // ext4's trigger_fs_error attribute (a real filesystem error on demand)
	CapResource = "capresource" // CAP_SYS_RESOURCE (online ext4 resize)
	SMP         = "smp"         // at least two CPUs this process may use
	ODirect     = "odirect"     // O_DIRECT on the test's temporary directory
	BufRing     = "bufring"     // io_uring provided-buffer rings (Linux 5.19)
	Ublk        = "ublk"        // /dev/ublk-control (ublk_drv loaded)
	ZeroCopy    = "zerocopy"    // UBLK_F_AUTO_BUF_REG
	BatchIO     = "batch"       // UBLK_F_BATCH_IO
	UpdateSize  = "updatesize"  // UBLK_F_UPDATE_SIZE
	Quiesce     = "quiesce"     // UBLK_F_QUIESCE
	UserCopy    = "usercopy"    // UBLK_F_USER_COPY
)

// Build tags: test binaries built with them have code the plugin's binary
// lacks. make unit and the VM build every test binary with both.
const (
	Failpoint = "failpoint" // -tags failpoint: failpoints and test hooks
	Ablation  = "ablation"  // -tags ablation: the benchmark ablation switches
)

// Opt-ins: tests that need more than a test machine (a cluster, a second
// boot, permission to change machine-wide state, the chart harness). Each is
// enabled by its own environment variable or harness, and listing it in
// FASTBLK_REQUIRE makes a run without it fail.
const (
	Cluster         = "k8s"              // FASTBLK_K8S: the cluster of hack/k8s/e2e.sh
	ClusterLong     = "k8s-long"         // FASTBLK_K8S_LONG=1: cluster tests of half an hour (make e2e-k8s-long)
	PowerCut        = "powercut"         // FASTBLK_POWERCUT: two VM boots of hack/vm/powercut.sh
	Sysctl          = "sysctl"           // FASTBLK_TEST_SYSCTL=1: may change machine-wide sysctls
	ExclusiveMounts = "exclusive-mounts" // FASTBLK_EXCLUSIVE_MOUNTS=1: no other test mounts meanwhile
	Chart           = "chart"            // hack/chart/test.sh: helm, the image archive, containerd, CRDs
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

// RequireTool skips (or fails, see Skip) unless the program name is
// installed.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Skip(t, Tools, "%s not installed (make deps installs it): %v", name, err)
	}
}

// LoopControl is the loop driver's control device.
const LoopControl = "/dev/loop-control"

// RequireLoop skips (or fails, see Skip) unless the test runs as root on
// a kernel with loop devices.
func RequireLoop(t testing.TB) {
	t.Helper()
	requireControl(t, LoopControl, Loop, "no loop devices")
}

// UblkControl is the ublk driver's control device.
const UblkControl = "/dev/ublk-control"

// RequireUblk skips (or fails, see Skip) unless the test runs as root on
// a kernel with ublk_drv loaded.
func RequireUblk(t testing.TB) {
	t.Helper()
	requireControl(t, UblkControl, Ublk, "no ublk_drv: run in the VM (hack/vm/run.sh)")
}

// requireControl skips (or fails) for lack of feature unless the test runs
// as root and the driver's control device exists.
func requireControl(t testing.TB, control, feature, why string) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(control); err != nil {
		Skip(t, feature, "%s: %v", why, err)
	}
}
