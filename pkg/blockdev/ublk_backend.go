package blockdev

import "fmt"

// newUblkBackend builds the ublk backend. Placeholder until the ublk
// package lands; owned by the ublk work.
func newUblkBackend(cfg BackendConfig) (Backend, error) {
	return nil, fmt.Errorf("ublk backend: %w", ErrNotSupported)
}
