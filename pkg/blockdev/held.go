package blockdev

// HeldReporter is implemented by backends that can keep a volume's device
// without serving it, when serving it could be wrong (the ublk backend:
// the device's state was lost and the volume's record disagrees with the
// kernel's view). Held returns why, by volume ID. Unlike HealthReporter's
// failures, these are not healed by a restart: they are reported in the
// volume's health condition and the node status, and the plugin stays live.
type HeldReporter interface {
	Held() map[string]error
}
