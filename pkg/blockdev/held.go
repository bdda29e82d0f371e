package blockdev

import (
	"errors"
	"time"
)

// ErrFailingIO marks a held device's reason (HeldReporter) when the backend
// fails the I/O of devices it cannot serve instead of holding it: the
// volume's writers get EIO.
var ErrFailingIO = errors.New("device fails its i/o")

// FailingReporter is implemented by backends that fail the I/O of devices
// they keep but cannot serve (the ublk backend, after a bound): FailingIO
// returns since when, by device path.
type FailingReporter interface {
	FailingIO() map[string]time.Time
}

// HeldReporter is implemented by backends that can keep a volume's device
// without serving it, when serving it could be wrong (the ublk backend:
// the device's state was lost and the volume's record disagrees with the
// kernel's view). Held returns why, by volume ID. Unlike HealthReporter's
// failures, these are not healed by a restart: they are reported in the
// volume's health condition and the node status, and the plugin stays live.
type HeldReporter interface {
	Held() map[string]error
}
