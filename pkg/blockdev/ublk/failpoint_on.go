//go:build failpoint

package ublk

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
