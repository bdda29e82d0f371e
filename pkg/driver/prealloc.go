package driver

import (
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
)

// keepAllocated stops discards on the device of a preallocated volume (see
// blkdev.DisableDiscard), at every attach: a discard, from fstrim or a
// filesystem mounted with discard, would punch the backing file and give
// its blocks back. A kernel that refuses is logged, not fatal: the volume
// still serves, and mkfs is told not to discard (formatOptions).
func keepAllocated(v blockdev.Volume, dev blockdev.Device) {
	if !v.Preallocated() {
		return
	}
	if err := blkdev.DisableDiscard(dev.Path); err != nil {
		klog.ErrorS(err, "preallocated volume's device still takes discards, which free its blocks", "volumeID", v.ID, "device", dev.Path)
	}
}

// formatOptions are the mkfs options for v's filesystem fsType. A
// preallocated volume's mkfs must not discard the device, as mkfs.ext4 and
// mkfs.xfs do by default: both backends punch a discarded range out of the
// backing file (the kernel loop driver and the ublk server alike), which
// would undo the preallocation before the first write. (keepAllocated
// stops discards at the device as well; this holds where a kernel refuses
// that.)
func formatOptions(v blockdev.Volume, fsType string) []string {
	if !v.Preallocated() {
		return nil
	}
	switch fsType {
	case "ext4":
		// Zeroing the inode tables and journal at mkfs (as WRITE_ZEROES
		// that keep the blocks) leaves nothing to the kernel's lazy
		// init, whose zeroing may unmap: the loop device punches it out.
		return []string{"-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"}
	case "xfs":
		return []string{"-K"}
	}
	return nil
}
