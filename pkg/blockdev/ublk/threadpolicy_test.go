package ublk

import (
	"errors"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestRoomForThread proves a per-device pool starts another thread only
// while the pids limit leaves room for it and its io-wq workers beside a
// reserve for the runtime and the mkfs and mount children, and that no
// limit (or none readable) never stops it.
func TestRoomForThread(t *testing.T) {
	need := int64(pidsReserve + 1 + dataplane.PerDeviceIOWQWorkers)
	for _, c := range []struct {
		headroom int64
		err      error
		want     bool
	}{
		{-1, nil, true},
		{0, errors.New("no cgroup"), true},
		{0, nil, false},
		{need - 1, nil, false},
		{need, nil, true},
		{1 << 20, nil, true},
	} {
		if got := roomForThread(c.headroom, c.err); got != c.want {
			t.Errorf("roomForThread(%d, %v) = %v, want %v", c.headroom, c.err, got, c.want)
		}
	}
}
