package ublk

import (
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestRequiredFeatures asserts that the driver offers every feature
// FASTBLK_REQUIRE lists (the VM sets it from the kernel it boots: Linux 7.3
// has them all). A kernel that lost one, or a probe that stopped seeing it,
// fails here, where the tests of that feature would otherwise narrow their
// coverage or skip.
func TestRequiredFeatures(t *testing.T) {
	f := needUblk(t)
	t.Logf("driver features: %s", FormatFlags(f))
	for _, c := range []struct {
		feature string
		flag    uint64
	}{
		{testgate.ZeroCopy, FlagAutoBufReg},
		{testgate.BatchIO, FlagBatchIO},
		{testgate.UpdateSize, FlagUpdateSize},
		{testgate.Quiesce, FlagQuiesce},
	} {
		if f&c.flag == 0 {
			testgate.Without(t, c.feature, "the driver lacks %s", FormatFlags(c.flag))
		}
	}
}
