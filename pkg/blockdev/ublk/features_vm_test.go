package ublk

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestRequiredFeatures asserts that the driver offers every feature
// FASTBLK_REQUIRE lists (the VM sets it from the kernel it boots), and on
// Linux 7.3, the VM's newest kernel, all of them. A kernel that lost one, or a probe that stopped seeing it,
// fails here, where the tests of that feature would otherwise narrow their
// coverage or skip.
func TestRequiredFeatures(t *testing.T) {
	f := needUblk(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	t.Logf("Linux %s, driver features: %s", release, FormatFlags(f))
	for _, c := range []struct {
		feature string
		flag    uint64
	}{
		{testgate.ZeroCopy, FlagAutoBufReg},
		{testgate.BatchIO, FlagBatchIO},
		{testgate.UpdateSize, FlagUpdateSize},
		{testgate.Quiesce, FlagQuiesce},
	} {
		switch {
		case f&c.flag != 0:
		case strings.HasPrefix(release, "7.3."):
			// The VM's newest kernel has them all, whatever
			// FASTBLK_REQUIRE says: a probe that stops seeing one fails.
			t.Errorf("Linux %s: the driver lacks %s", release, FormatFlags(c.flag))
		default:
			testgate.Without(t, c.feature, "the driver lacks %s", FormatFlags(c.flag))
		}
	}
}
