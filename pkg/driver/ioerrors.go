package driver

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// fullBelow is the free space of the data directory under which
// WatchIOErrors calls it full. Not one block: xfs takes a block for a file
// only with the worst case of the file's extent map growing reserved too
// (xfs_bmap_worst_indlen, fs/xfs/libxfs/xfs_bmap.c), so a full xfs refuses
// every write while statfs still counts a few blocks free.
const fullBelow = 1 << 20

// ioWatch is what WatchIOErrors remembers between two looks.
type ioWatch struct {
	errors map[string]uint64 // volume ID -> errors counted so far
	full   map[string]bool   // device class -> its directory had no free block
}

// WatchIOErrors looks every interval, until ctx ends, for what makes I/O
// on the volumes fail and says so in the log: the volumes whose devices
// completed requests with an error since the last look (backends that count
// them, ublk: fastblk_volume_errors_total), and the data directory running
// out of space, which fails every write into an unallocated part of a
// sparse volume with ENOSPC, and its coming back. The application sees the
// errors themselves at once; this tells the operator which volume and why.
func (d *Driver) WatchIOErrors(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	w := ioWatch{errors: map[string]uint64{}, full: map[string]bool{}}
	for {
		d.lookForIOErrors(&w)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lookForIOErrors is one look of WatchIOErrors.
func (d *Driver) lookForIOErrors(w *ioWatch) {
	d.store.each(func(class string, s *store.Store) {
		st, err := fsstat.Stat(s.Dir())
		if err != nil {
			return
		}
		full := st.AvailableBytes < fullBelow
		switch {
		case full && !w.full[class]:
			klog.ErrorS(nil, "the data directory is full: writes into unallocated parts of volumes, and overwrites of blocks they share with "+
				"snapshots or clones, fail with ENOSPC until space is freed",
				"deviceClass", class, "dataDir", s.Dir(), "availableBytes", st.AvailableBytes, "totalBytes", st.TotalBytes)
		case !full && w.full[class]:
			klog.InfoS("the data directory has free space again", "deviceClass", class, "availableBytes", st.AvailableBytes)
		}
		w.full[class] = full
	})
	statser, ok := d.backend.(blockdev.IOStatser)
	if !ok {
		return
	}
	seen := make(map[string]uint64, len(w.errors))
	for _, v := range d.store.Volumes() {
		io, ok := statser.IOStats(v.ID)
		if !ok {
			continue
		}
		seen[v.ID] = io.Errors
		if last, known := w.errors[v.ID]; io.Errors > last || (!known && io.Errors > 0) {
			klog.ErrorS(nil, "volume I/O failed: the device completed requests with an error (its backing file's)",
				"volumeID", v.ID, "name", v.Name, "newErrors", io.Errors-last, "errors", io.Errors)
		}
	}
	w.errors = seen
}
