// Package backendtest is the conformance suite every blockdev.Backend runs:
// attach, idempotent attach, real O_DIRECT I/O through the device down to the
// backing file, resize, list, detach, busy detach, read-only devices, and
// re-adoption of devices by a new backend after Close.
//
// The suite drives real kernel devices and needs root; it skips otherwise.
// Each backend's own test calls Run with a constructor:
//
//	func TestLoopBackend(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T, dataDir string) blockdev.Backend { ... })
//	}
//
// The constructor must derive the device-link directory from dataDir (for
// example dataDir/dev), so that a backend made again for the same data
// directory, as after a plugin restart, uses the same links; and Close must
// not detach devices.
package backendtest
