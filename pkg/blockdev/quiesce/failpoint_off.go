//go:build !failpoint

package quiesce

// failpoint marks a point where a test build (go build -tags failpoint) can
// stop the process, so that a test kills it exactly there; in every other
// build it does nothing and costs nothing.
func failpoint(string) {}
