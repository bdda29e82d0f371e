package driver

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// changeTracker is implemented by backends whose devices record the ranges
// of their volume that writes, discards and write-zeroes change (the ublk
// backend; package cbt). The store keeps those records with each snapshot
// (store/changes.go), from which GetMetadataDelta answers.
type changeTracker interface {
	// AttachTracked is Attach whose new device's record starts from
	// changes, trusted when they are all the volume's changes since its
	// last snapshot.
	AttachTracked(ctx context.Context, req blockdev.AttachRequest, changes []cbt.Extent, trusted bool) (blockdev.Device, error)
	// DetachTracked is Detach that hands over the device's final record
	// (tracked false when no tracked device was detached).
	DetachTracked(ctx context.Context, volumeID string) (changes []cbt.Extent, trusted, tracked bool, err error)
	// CutChanges returns the device's record since its attach or last
	// cut and starts a new one; the caller holds the device's I/O.
	CutChanges(volumeID string) (changes []cbt.Extent, trusted bool, err error)
	// PutBackChanges returns a cut whose snapshot failed.
	PutBackChanges(volumeID string, changes []cbt.Extent, trusted bool)
}

// attach attaches the volume's device. First the volume's change record is
// marked untrusted on disk (store.BeginTracking), so that whatever happens
// while the device serves, a crash included, no later delta trusts a
// record that may miss a write; a tracking backend's new device carries
// the record on in memory.
func (d *Driver) attach(ctx context.Context, v blockdev.Volume) (blockdev.Device, error) {
	changes, trusted, err := d.store.BeginTracking(ctx, v.ID)
	if err != nil {
		return blockdev.Device{}, err
	}
	if ct, ok := d.backend.(changeTracker); ok {
		return ct.AttachTracked(ctx, d.attachRequest(v), changes, trusted)
	}
	return d.backend.Attach(ctx, d.attachRequest(v))
}

// detach detaches the volume's device and, from a tracking backend, records
// the change record it hands over: the clean hand-over that makes the
// volume's record trusted again. A record that cannot be written stays
// untrusted, which costs the next delta a comparison of the files, not
// the detach.
func (d *Driver) detach(ctx context.Context, id string) error {
	ct, ok := d.backend.(changeTracker)
	if !ok {
		return d.backend.Detach(ctx, id)
	}
	changes, trusted, tracked, err := ct.DetachTracked(ctx, id)
	if err != nil || !tracked {
		return err
	}
	if err := d.store.EndTracking(ctx, id, changes, trusted); err != nil {
		klog.ErrorS(err, "change record not handed over: the volume's next delta compares files", "volumeID", id)
	}
	return nil
}

// changeCut is how the store cuts the change record of the volume's device
// while it is held for a snapshot (nil for a backend that does not track).
func (d *Driver) changeCut(id string) *store.ChangeCut {
	ct, ok := d.backend.(changeTracker)
	if !ok {
		return nil
	}
	return &store.ChangeCut{
		Cut:     func() ([]cbt.Extent, bool, error) { return ct.CutChanges(id) },
		PutBack: func(changes []cbt.Extent, trusted bool) { ct.PutBackChanges(id, changes, trusted) },
	}
}
