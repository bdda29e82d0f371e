//go:build failpoint

package quiesce

import (
	"fmt"
	"os"
)

// FailpointEnv names the failpoint at which a binary built with -tags
// failpoint stops: it prints "failpoint <name>" to stderr and blocks
// forever, for the test to kill it there.
const FailpointEnv = "FASTBLK_FAILPOINT"

func failpoint(name string) {
	if os.Getenv(FailpointEnv) != name {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s\n", name)
	select {}
}
