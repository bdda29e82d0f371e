package ublk

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestRequiredFeatures asserts that the driver offers every feature
// FASTBLK_REQUIRE lists (the VM sets it from the kernel it boots), and on
// Linux 7.3, the VM's newest kernel, all of them. A kernel that lost one, or a probe that stopped seeing it,
// fails here, where the tests of that feature would otherwise narrow their
// coverage or skip. Where the kernel offers USER_COPY, a device of the
// default configuration, and one without zero copy, must say how it
// copies and take 1 MiB requests (checkCopyModes).
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
		{testgate.UserCopy, FlagUserCopy},
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
	if f&FlagUserCopy != 0 {
		checkCopyModes(t, f)
	}
}

// checkCopyModes attaches a volume with the default configuration and one
// with zero copy off, and checks the copy mode and request size each
// device reports (its Tuning, kept in its state file) against the
// kernel's: zero copy where the driver has AUTO_BUF_REG, else user copy,
// and 1 MiB requests either way.
func checkCopyModes(t *testing.T, f uint64) {
	want := "user-copy"
	if f&FlagAutoBufReg != 0 {
		want = "zero-copy"
	}
	for _, c := range []struct {
		zc   Mode
		want string
	}{{ModeAuto, want}, {ModeOff, "user-copy"}} {
		dir := scratchDir(t)
		s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: filepath.Join(dir, "state"), ZeroCopy: c.zc})
		if err != nil || len(errs) != 0 {
			t.Fatalf("start: %v, %v", err, errs)
		}
		d, err := s.Attach(context.Background(), AttachSpec{VolumeID: "vol", File: sparseFile(t, dir, "vol.img", 16<<20)})
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		kb := maxSectorsKB(t, d.Path)
		t.Logf("zero copy %s: device %s copies as %s, %d-byte requests (kernel: %d KiB), flags %s",
			c.zc, d.Path, d.Tuning.CopyMode(), d.Tuning.MaxIOBytes, kb, FormatFlags(d.Flags))
		if d.Tuning.CopyMode() != c.want || d.Tuning.MaxIOBytes != 1<<20 || kb != 1024 ||
			(d.Flags&FlagUserCopy != 0) != (c.want == "user-copy") {
			t.Errorf("zero copy %s: device reports %s with %d-byte requests (kernel %d KiB, flags %s), want %s with 1 MiB",
				c.zc, d.Tuning.CopyMode(), d.Tuning.MaxIOBytes, kb, FormatFlags(d.Flags), c.want)
		}
		if err := s.Detach(context.Background(), "vol"); err != nil {
			t.Error(err)
		}
		s.Close()
	}
}
