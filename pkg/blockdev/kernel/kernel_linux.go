package kernel

import (
	"strings"

	"golang.org/x/sys/unix"
)

// Release returns the running kernel's release string (uname -r).
func Release() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(uts.Release[:]), "\x00")
}
