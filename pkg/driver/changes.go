package driver

import (
	"context"
	"errors"
	"fmt"

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
	// PutBackChanges returns a cut whose snapshot failed; an error
	// says that no record took it.
	PutBackChanges(volumeID string, changes []cbt.Extent, trusted bool) error
	// HandOver leaves the device's record for the next process as the
	// plugin stops without releasing the device; nothing may use the
	// device afterwards.
	HandOver(ctx context.Context, volumeID string) error
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
// the detach. A device of a former backend (deviceBackend) is detached
// too.
func (d *Driver) detach(ctx context.Context, id string) error {
	for _, b := range d.cfg.FormerBackends {
		if err := b.Detach(ctx, id); err != nil {
			return err
		}
	}
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
// while it is held for a snapshot (nil when the device does not track: a
// backend that does not, or a device of a former backend).
func (d *Driver) changeCut(id string) *store.ChangeCut {
	ct, ok := d.backend.(changeTracker)
	if v, err := d.store.Volume(id); !ok || err != nil || d.deviceBackend(v) != d.backend {
		return nil
	}
	return &store.ChangeCut{
		Cut:     func() ([]cbt.Extent, bool, error) { return ct.CutChanges(id) },
		PutBack: func(changes []cbt.Extent, trusted bool) error { return ct.PutBackChanges(id, changes, trusted) },
	}
}

// HandOver is the plugin's last act as it stops (SIGTERM: a rollout), once
// no CSI call runs any more: every staged volume whose device records its
// changes hands its record over to the next process (the ublk backend
// leaves it in the device's state file, the device's I/O held, for the
// next process's re-adoption), so that the first delta after the restart
// still comes from the records. Calls still waiting for a volume fail
// (Unavailable) from now on; each volume's lock is taken, after whatever
// holds it (a snapshot finishes, its cut kept or put back first), and
// kept: nothing may change a volume after its record was handed over.
// Volumes not reached within ctx hand nothing over: their record is lost,
// as in a crash, and their first delta compares files.
func (d *Driver) HandOver(ctx context.Context) error {
	d.stop()
	ct, ok := d.backend.(changeTracker)
	if !ok {
		return nil
	}
	var errs []error
	for _, v := range d.store.Volumes() {
		if v.Node.StagingPath == "" || d.deviceBackend(v) != d.backend {
			continue
		}
		if _, err := d.locks.lock(ctx, "volume/"+v.ID); err != nil { // kept
			errs = append(errs, fmt.Errorf("hand over the change record of %s: %w", v.ID, err))
			continue
		}
		if err := ct.HandOver(ctx, v.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
