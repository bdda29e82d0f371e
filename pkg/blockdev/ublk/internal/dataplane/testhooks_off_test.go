//go:build !failpoint

package dataplane

import (
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// injectEAGAIN skips the test: the hooks it drives exist only with -tags
// failpoint (testhooks_on_linux.go).
func injectEAGAIN(t *testing.T, _ *Queue, _ int32) {
	t.Helper()
	testgate.Skip(t, testgate.Failpoint, "built without -tags failpoint: no test hooks")
}

func (*Queue) eagainLeft() int32 { return 0 }

// failThread skips the test: FailThread exists only with -tags failpoint.
func failThread(t *testing.T, _ *Thread) func() {
	t.Helper()
	testgate.Skip(t, testgate.Failpoint, "built without -tags failpoint: no test hooks")
	return func() {}
}
