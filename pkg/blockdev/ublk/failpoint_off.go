//go:build !failpoint

package ublk

// failAt marks a failpoint (failpoint.go) where a test build (-tags
// failpoint) can kill or fail the operation; here it does nothing.
func failAt(string) error { return nil }
