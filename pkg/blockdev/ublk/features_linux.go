package ublk

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Supported kernels: Linux 6.5 and later. 6.5 brought GET_FEATURES (the
// probe everything here relies on) and the ioctl command encoding is the
// only one csi-fastblk sends (6.4+); user recovery exists since 6.1. Older
// kernels are refused by Features with an error wrapping
// errors.ErrUnsupported that says so.
const MinKernel = "6.5"

// flagNames names the UBLK_F_* bits, index = bit.
var flagNames = [...]string{
	"SUPPORT_ZERO_COPY", "URING_CMD_COMP_IN_TASK", "NEED_GET_DATA", "USER_RECOVERY",
	"USER_RECOVERY_REISSUE", "UNPRIVILEGED_DEV", "CMD_IOCTL_ENCODE", "USER_COPY",
	"ZONED", "USER_RECOVERY_FAIL_IO", "UPDATE_SIZE", "AUTO_BUF_REG",
	"QUIESCE", "PER_IO_DAEMON", "BUF_REG_OFF_DAEMON", "BATCH_IO",
	"INTEGRITY", "SAFE_STOP_DEV", "NO_AUTO_PART_SCAN", "SHMEM_ZC", "IO_DESC_SIZE",
}

// FlagNames decodes UBLK_F_* bits; unknown bits show as "bit N".
func FlagNames(f uint64) []string {
	var names []string
	for bit := 0; bit < 64; bit++ {
		if f&(1<<bit) == 0 {
			continue
		}
		if bit < len(flagNames) {
			names = append(names, flagNames[bit])
		} else {
			names = append(names, fmt.Sprintf("bit %d", bit))
		}
	}
	return names
}

// FormatFlags is FlagNames joined with "|".
func FormatFlags(f uint64) string { return strings.Join(FlagNames(f), "|") }

// errnoUnknown reports errnos an older driver uses for an unknown command:
// EINVAL, EOPNOTSUPP and the kernel-internal ENOTSUPP (524).
func errnoUnknown(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.Errno(524))
}

// Features returns the driver's UBLK_F_* flags through GET_FEATURES. A
// kernel without GET_FEATURES (older than 6.5) or without the ioctl
// encoding is refused with an error wrapping errors.ErrUnsupported.
func Features(c *Control) (uint64, error) {
	f, err := c.GetFeatures()
	if err != nil {
		if errnoUnknown(err) {
			return 0, fmt.Errorf("ublk: kernel lacks GET_FEATURES, csi-fastblk needs Linux %s or later: %w (%v)",
				MinKernel, errors.ErrUnsupported, err)
		}
		return 0, err
	}
	if f&FlagCmdIoctlEncode == 0 {
		return 0, fmt.Errorf("ublk: driver lacks CMD_IOCTL_ENCODE, csi-fastblk needs Linux %s or later: %w",
			MinKernel, errors.ErrUnsupported)
	}
	return f, nil
}

// probe caches the conclusive answer of HaveUblk.
var probe struct {
	sync.Mutex
	done bool
	f    uint64
	err  error
}

// HaveUblk reports whether this kernel can serve csi-fastblk's ublk
// devices: nil means yes (and returns the feature flags), an error
// wrapping errors.ErrUnsupported means no (no ublk_drv, or a kernel older
// than MinKernel), any other error is inconclusive and is not cached.
func HaveUblk() (uint64, error) {
	probe.Lock()
	defer probe.Unlock()
	if probe.done {
		return probe.f, probe.err
	}
	c, err := OpenControl()
	if err == nil {
		probe.f, err = Features(c)
		c.Close()
	}
	if err == nil || errors.Is(err, errors.ErrUnsupported) {
		probe.done, probe.err = true, err
	}
	return probe.f, err
}

// Mode switches an optional mechanism: ServerConfig.ZeroCopy, UserCopy,
// BatchIO and NowaitWrites.
type Mode string

// Modes.
const (
	ModeAuto Mode = "auto" // where the kernel offers it (or, for NOWAIT writes, needs it)
	ModeOn   Mode = "on"   // always (zero copy: required; fail without it)
	ModeOff  Mode = "off"  // never
)

// ParseMode parses "auto", "on" or "off" ("" = auto) for the setting named.
func ParseMode(name, s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeOn, ModeOff:
		return Mode(s), nil
	}
	return "", fmt.Errorf("%s %q: want auto, on or off: %w", name, s, errInvalid)
}

// addFlags chooses the ADD_DEV flags from the driver's features: user
// recovery with reissue (a file backend tolerates the same write twice),
// QUIESCE and UPDATE_SIZE where offered, no partition scan where the driver
// lets us say so, AUTO_BUF_REG zero copy per zc, BATCH_IO per batch, and
// USER_COPY per uc for a device without zero copy (the server copies
// through /dev/ublkcN instead of the kernel at FETCH and COMMIT; it does
// not go with batch i/o, which then wins in auto mode). Pure function.
func addFlags(features uint64, zc, batch, uc Mode) (uint64, error) {
	want := FlagCmdIoctlEncode | FlagUserRecovery | FlagUserRecoveryReissue
	if features&FlagUserRecovery == 0 {
		return 0, fmt.Errorf("ublk: driver lacks USER_RECOVERY: %w", errors.ErrUnsupported)
	}
	for _, opt := range []uint64{FlagUpdateSize, FlagQuiesce, FlagNoAutoPartScan} {
		want |= features & opt
	}
	for _, m := range []struct {
		mode Mode
		flag uint64
		what string
	}{
		{zc, FlagAutoBufReg, "zero copy needs AUTO_BUF_REG (Linux 6.16+)"},
		{batch, FlagBatchIO, "batch i/o needs BATCH_IO (Linux 7.0+)"},
	} {
		switch m.mode {
		case ModeOn:
			if features&m.flag == 0 {
				return 0, fmt.Errorf("ublk: %s: %w", m.what, errors.ErrUnsupported)
			}
			want |= m.flag
		case ModeAuto:
			want |= features & m.flag
		}
	}
	switch {
	case uc == ModeOff || zeroCopy(want):
	case features&FlagUserCopy == 0 && uc == ModeOn:
		return 0, fmt.Errorf("ublk: user copy needs USER_COPY (Linux 6.5+): %w", errors.ErrUnsupported)
	case want&FlagBatchIO != 0 && uc == ModeOn:
		return 0, fmt.Errorf("ublk: user copy does not go with batch i/o: %w", errors.ErrUnsupported)
	case want&FlagBatchIO == 0:
		want |= features & FlagUserCopy
	}
	return want, nil
}

// userCopy reports whether negotiated flags mean the server copies through
// /dev/ublkcN (USER_COPY without zero copy).
func userCopy(flags uint64) bool { return flags&FlagUserCopy != 0 && !zeroCopy(flags) }

// zeroCopy reports whether negotiated flags mean buffer-less queues.
func zeroCopy(flags uint64) bool { return flags&(FlagAutoBufReg|FlagSupportZeroCopy) != 0 }
