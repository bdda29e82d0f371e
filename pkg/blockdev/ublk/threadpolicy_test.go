package ublk

import (
	"errors"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestDeviceThreadBound proves a per-device pool's bound follows the pids
// limit: each thread may cost itself and its io-wq workers, a reserve stays
// for the runtime and the mkfs and mount children, at least one thread is
// always allowed, and no limit (or none readable) gives the default.
func TestDeviceThreadBound(t *testing.T) {
	per := int64(1 + dataplane.PerDeviceIOWQWorkers)
	for _, c := range []struct {
		headroom int64
		err      error
		want     int
	}{
		{-1, nil, DefaultDeviceThreads},
		{100, errors.New("no cgroup"), DefaultDeviceThreads},
		{0, nil, 1},
		{pidsReserve, nil, 1},
		{pidsReserve + 3*per, nil, 3},
		{pidsReserve + 3*per + per - 1, nil, 3},
		{1 << 20, nil, DefaultDeviceThreads},
	} {
		if got := deviceThreadBound(c.headroom, c.err); got != c.want {
			t.Errorf("deviceThreadBound(%d, %v) = %d, want %d", c.headroom, c.err, got, c.want)
		}
	}
}
