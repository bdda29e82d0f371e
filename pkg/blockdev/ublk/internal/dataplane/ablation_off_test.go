//go:build !ablation

package dataplane

import (
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestParseAblation stands for the ablation tests (ablation_test.go), which
// need -tags ablation: it skips, or fails where FASTBLK_REQUIRE lists
// ablation.
func TestParseAblation(t *testing.T) {
	testgate.Skip(t, testgate.Ablation, "built without -tags ablation: the ablation switches are not tested")
}
