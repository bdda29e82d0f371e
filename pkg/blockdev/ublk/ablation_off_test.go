//go:build !ablation

package ublk

import (
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestAblationsServeCorrectly needs -tags ablation (ablation_test.go): it
// skips, or fails where FASTBLK_REQUIRE lists ablation.
func TestAblationsServeCorrectly(t *testing.T) {
	testgate.Skip(t, testgate.Ablation, "built without -tags ablation: the ablation switches are not tested")
}
