//go:build !failpoint

package dataplane

// Without -tags failpoint the test hooks (testhooks_on_linux.go) are empty:
// nothing for the plugin to check per round or per completion.

func runRoundHook(*threadLoop) {}

func runRingCloseHook(*threadLoop) {}

func runFailHook(*threadLoop, failWindow, int) {}

func runWriteIssuedHook(uint64, uint32) {}

type queueHooks struct{}

func (*queueHooks) eagain() bool { return false }

func (*queueHooks) backingIdle() {}
