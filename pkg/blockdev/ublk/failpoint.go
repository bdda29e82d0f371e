package ublk

// failpoint, when set, is called at named points of operations that span
// several durable steps, so that a test can kill the process exactly there
// and check that a restart converges. Only tests set it (see
// failpoint_test.go); in the plugin it stays nil.
var failpoint func(name string)

// Failpoints.
const (
	// fpStateSaved is after a new device's state file is durable and
	// before the device is started (START_DEV).
	fpStateSaved = "ublk-state-saved"
)

func failAt(name string) {
	if failpoint != nil {
		failpoint(name)
	}
}
