package blkdev

import (
	"fmt"
	"os"
	"path/filepath"
)

// DisableDiscard stops the device at path (a node or a link to one) from
// taking discards: its queue's discard_max_bytes becomes 0, so BLKDISCARD,
// fstrim and the discard mount option get EOPNOTSUPP, and no discard
// reaches the backend. Both backends turn a discard into a hole punched in
// the backing file, which a preallocated volume must keep. The setting
// lives as long as the device.
func DisableDiscard(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", path, err)
	}
	knob := filepath.Join("/sys/block", filepath.Base(real), "queue", "discard_max_bytes")
	if err := os.WriteFile(knob, []byte("0"), 0); err != nil {
		return fmt.Errorf("disable discard on %s: %w", real, err)
	}
	return nil
}
