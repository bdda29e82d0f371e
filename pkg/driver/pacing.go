package driver

import (
	"context"
	"io"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// This node's background copies are paced by what they cost its volumes in
// use (d.copies, pkg/blockdev/copypace), each where its bytes move:
//   - a restore or clone from a source of this node: the store's copy of
//     the file (pacedCopy, through filecopy.WithPacer);
//   - a stream to a peer: the sender's frames (PaceSource), and for a
//     clone the point-in-time copy of the volume before it (copyForPeer);
//   - a pull from a peer: the writes of what it receives (pacedWriter). A
//     receiver that waits holds the sender back through the stream's flow
//     control, so each node holds a copy to what it costs there.
//
// The copy of a snapshot is not paced: it holds its volume for part of
// the time and should end soon.

// attachedDevices lists the devices of this node's attached volumes.
func (d *Driver) attachedDevices(ctx context.Context) ([]string, error) {
	devs, err := d.backend.List(ctx)
	paths := make([]string, 0, len(devs))
	for _, dev := range devs {
		paths = append(paths, dev.Path)
	}
	return paths, err
}

// pacedCopy returns ctx carrying a Pacer for a copy made under it by the
// store, with no rate of its own, to be done by by (zero: no deadline),
// and the Pacer's release. With pacing off it returns ctx as it is.
func (d *Driver) pacedCopy(ctx context.Context, by time.Time) (context.Context, func()) {
	if d.copies.Off() {
		return ctx, func() {}
	}
	pace := d.copies.Pacer(0)
	pace.FinishBy(by)
	return filecopy.WithPacer(ctx, pace), pace.Close
}

// PaceSource paces a stream this node sends (peer.SourcePacer): at most
// rate bytes per second, and by what it costs this node.
func (p *PeerService) PaceSource(_ *peer.ReadRequest, rate int64) peer.Pacer {
	return p.d.copies.Pacer(rate)
}

// pacedWriter writes what a pull receives, paced by this node's Governor.
type pacedWriter struct {
	ctx  context.Context
	w    io.WriterAt
	pace *copypace.Pacer
}

func (w pacedWriter) WriteAt(b []byte, off int64) (int, error) {
	if err := w.pace.Wait(w.ctx, len(b)); err != nil {
		return 0, err
	}
	return w.w.WriteAt(b, off)
}

// peerCopyTime is how soon the point-in-time copy of a volume a peer
// clones must be done: well within the time the peer waits for a source
// to be prepared (pullPrepare, the same on every node).
func peerCopyTime() time.Time { return time.Now().Add(pullPrepare / 2) }
