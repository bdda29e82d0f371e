package ublk

// Failpoints.
const (
	// fpStateSaved is after a new device's state file is durable and
	// before the device is started (START_DEV).
	fpStateSaved = "ublk-state-saved"
	// fpStarted is after a new device's START_DEV succeeded, before the
	// wait for its block device: the creation's last step.
	fpStarted = "ublk-started"
	// fpDeleting is in the removal of a device (Delete, or a failed
	// creation) after its queues ended and /dev/ublkcN was closed, before
	// DEL_DEV.
	fpDeleting = "ublk-deleting"
	// fpRecovering is in the re-adoption of a device after its queues
	// started on the server's threads, before END_USER_RECOVERY.
	fpRecovering = "ublk-recovering"
	// fpHealing is in the in-process re-adoption of a device whose server
	// thread failed, after its queues ended and /dev/ublkcN was closed,
	// before START_USER_RECOVERY (threadheal_linux.go).
	fpHealing = "ublk-healing"
)
