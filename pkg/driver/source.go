package driver

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// The sources of CreateVolume: a snapshot or volume of this node, copied
// by the store (a reflink where the filesystem can), or one of another
// node, pulled from there (pull.go) or handed off to it (peer.go).

// remoteSource records in spec a source that lives on the node tagged
// tag, to be pulled from there or handed off to it; without the peer
// channel it is sourceElsewhere.
func (d *Driver) remoteSource(spec *store.VolumeSpec, kind, id string) error {
	storeID, tag := splitID(id)
	if d.cfg.Peers == nil {
		return d.sourceElsewhere(kind, id)
	}
	spec.SourceNode = tag
	if kind == "snapshot" {
		spec.SourceSnapshotID = storeID
	} else {
		spec.SourceVolumeID = storeID
	}
	return nil
}

// cloneHold returns how to hold the volume src while the volume name is
// cloned from it: nil when the clone exists already (a repeated call
// copies nothing) or src is not in use; a missing src is left to the store
// to report.
func (d *Driver) cloneHold(name, src string) (store.Hold, error) {
	if _, err := d.store.Volume(blockdev.VolumeID(name)); err == nil {
		return nil, nil
	}
	v, err := d.store.Volume(src)
	if err != nil {
		return nil, nil
	}
	return d.holdFor(v)
}

// sizeFromSource makes a volume created from a source at least as large as
// the source when the request named no size.
func (d *Driver) sizeFromSource(spec *store.VolumeSpec, cr *csi.CapacityRange) error {
	var srcSize int64
	switch {
	case spec.SourceSnapshotID != "":
		snap, err := d.store.Snapshot(spec.SourceSnapshotID)
		if err != nil {
			return fmt.Errorf("source snapshot %s: %w", spec.SourceSnapshotID, err)
		}
		srcSize = snap.SizeBytes
	case spec.SourceVolumeID != "":
		v, err := d.store.Volume(spec.SourceVolumeID)
		if err != nil {
			return fmt.Errorf("source volume %s: %w", spec.SourceVolumeID, err)
		}
		srcSize = v.SizeBytes
	default:
		return nil
	}
	if cr.GetRequiredBytes() == 0 && spec.SizeBytes < srcSize {
		if lim := cr.GetLimitBytes(); lim > 0 && srcSize > lim {
			return fmt.Errorf("source is %d bytes, above the limit %d: %w", srcSize, lim, blockdev.ErrOutOfRange)
		}
		spec.SizeBytes = srcSize
	}
	return nil
}
