package blockdev

import (
	"strings"

	"golang.org/x/sys/unix"
)

// KernelRelease returns the running kernel's release string (uname -r).
func KernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(uts.Release[:]), "\x00")
}
