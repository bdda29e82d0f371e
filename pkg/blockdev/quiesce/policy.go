package quiesce

import (
	"context"
	"errors"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// ErrInconsistent is returned by For for a volume in use that no means can
// hold steady: a raw block device whose backend cannot hold its I/O, on a
// data directory that cannot reflink, whose copy would be torn.
var ErrInconsistent = errors.New("no crash-consistent copy possible")

// For returns how to hold the volume v steady while its file is copied,
// and a short name of the means for logs; a nil hold when v is not staged
// (nothing writes to it). The policy:
//
//   - a mounted volume: its filesystem is frozen (FreezeVolume, recorded in
//     dataDir first, so that a plugin killed meanwhile thaws it when it
//     starts again), then, where the backend can (holder), its device's
//     I/O held too: a freeze stops the filesystem's writers, not a writer
//     with the device open (root, beside the filesystem), and does not
//     wait for such a writer's requests in flight, which the device's
//     hold does. Released the other way round: the device resumes, then
//     the filesystem thaws;
//   - a raw block volume: the backend holds its device's I/O (holder, nil
//     when the backend cannot); without a holder (loop) the device can
//     only be flushed (FlushDevice), and the copy is consistent only as a
//     single reflink, so a data directory that cannot reflink
//     (canReflink) gets ErrInconsistent rather than a torn copy.
//
// For only chooses; the store runs the hold around its copy.
func For(v blockdev.Volume, dataDir string, holder blockdev.IOHolder, canReflink func() (bool, error)) (
	hold func(ctx context.Context) (release func() error, err error), how string, err error) {
	id, path, dev := v.ID, v.Node.StagingPath, v.Node.Device
	switch {
	case path == "":
		return nil, "", nil
	case !v.Node.Block && holder == nil:
		return func(ctx context.Context) (func() error, error) {
			return FreezeVolume(ctx, dataDir, id, path, dev)
		}, "filesystem frozen", nil
	case !v.Node.Block:
		return func(ctx context.Context) (func() error, error) {
			thaw, err := FreezeVolume(ctx, dataDir, id, path, dev)
			if err != nil {
				return nil, err
			}
			resume, err := holder.HoldIO(ctx, id)
			if err != nil {
				return nil, errors.Join(err, thaw())
			}
			return func() error { return errors.Join(resume(), thaw()) }, nil
		}, "filesystem frozen, device i/o held", nil
	case holder != nil:
		return func(ctx context.Context) (func() error, error) {
			return holder.HoldIO(ctx, id)
		}, "device i/o held", nil
	}
	reflink, err := canReflink()
	if err != nil {
		return nil, "", err
	}
	if !reflink {
		return nil, "", ErrInconsistent
	}
	return func(ctx context.Context) (func() error, error) {
		return func() error { return nil }, FlushDevice(ctx, dev)
	}, "device flushed", nil
}
