//go:build !failpoint

package ublk

import (
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// Without -tags failpoint there are no failpoints or test hooks
// (failpoint_on_test.go): the tests that need them skip, or fail where
// FASTBLK_REQUIRE lists failpoint.

func noHooks(t *testing.T) {
	t.Helper()
	testgate.Skip(t, testgate.Failpoint, "built without -tags failpoint: no failpoints or test hooks")
}

func crashAt(t *testing.T, _, _, _, _ string) { noHooks(t) }

func setFailpoint(t *testing.T, _ func(name string) error) { noHooks(t) }

func failThread(t *testing.T, _ *dataplane.Thread) func() {
	noHooks(t)
	return nil
}

func bufPages(t *testing.T, _ *dataplane.Thread) (resident, registered, most int) {
	noHooks(t)
	return
}

func injectEAGAIN(t *testing.T, _ *dataplane.Queue, _ int32) { noHooks(t) }

func eagainLeft(*dataplane.Queue) int32 { return 0 }
