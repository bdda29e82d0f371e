//go:build failpoint

package ublk

import "github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"

// failpoint, when set, is called at named points of operations that span
// several steps, so that a test can kill the process exactly there, make
// the operation fail there (a non-nil error is returned as the step's), or
// look at the kernel's state there. Only tests set it (see
// failpoint_on_test.go); the plugin is built without it (-tags failpoint
// adds it; failpoint_off.go).
var failpoint func(name string) error

func failAt(name string) error {
	if failpoint != nil {
		return failpoint(name)
	}
	return nil
}

// OnWriteIssued runs f on a server thread after it issued each backing
// write of a device (recorded in the device's change record and in flight)
// and before it submits it, so that a test can hold such a write and look
// at what runs meanwhile (a snapshot's cut). stop ends it.
func OnWriteIssued(f func(off uint64, n uint32)) (stop func()) { return dataplane.OnWriteIssued(f) }
