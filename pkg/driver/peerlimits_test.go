package driver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// fakePeers is a Forwarder whose ReadData is read; its other calls are
// Unimplemented.
type fakePeers struct {
	read func(ctx context.Context, sink peer.Sink) error
}

func (f fakePeers) ModifyVolume(context.Context, string, *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f fakePeers) ExpandVolume(context.Context, string, *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f fakePeers) CreateVolume(context.Context, string, *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f fakePeers) ReadData(ctx context.Context, _ string, _ *peer.ReadRequest, sink peer.Sink, _ time.Duration) (peer.Received, error) {
	return peer.Received{}, f.read(ctx, sink)
}

// pullWith has n2, alone, restore a snapshot of n1 through read, within
// timeout; it checks that n2 keeps nothing of a failed copy.
func pullWith(t *testing.T, timeout time.Duration, setup func(d *Driver), read func(ctx context.Context, sink peer.Sink) error) error {
	t.Helper()
	requireRoot(t)
	n2 := newTestNodeOn(t, t.TempDir(), "n2")
	n2.d.cfg.Peers = fakePeers{read: read}
	if setup != nil {
		setup(n2.d)
	}
	files := n2.dataFiles()
	snap := blockdev.SnapshotID("snap") + "-n1"
	_, err := n2.createPulled("pvc-restore", 1<<20, snapshotSource(snap), nil, timeout)
	if now := n2.dataFiles(); err != nil && now != files {
		t.Errorf("n2 kept something of the failed copy:\n%s", now)
	}
	return err
}

// waitForCut blocks until the pull's context ends, as a stream whose peer
// sends wait frames and nothing else.
func waitForCut(ctx context.Context) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

// TestPullPanicIsInternal: a panic in a pull's goroutine fails that pull
// with Internal and leaves nothing; before, it ended the plugin.
func TestPullPanicIsInternal(t *testing.T) {
	err := pullWith(t, 10*time.Second, nil, func(_ context.Context, sink peer.Sink) error {
		if _, err := sink.Start(1<<20, 4096); err != nil {
			return err
		}
		panic("a bug")
	})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panic") {
		t.Errorf("a pull that panics: %v, want Internal", err)
	}
}

// TestPullDeadline: a pull whose peer keeps it alive without sending data
// ends DeadlineExceeded, at the source's size at the least rate and the
// slack from its header, or at pullPrepare without one. Before, it ran
// for ever.
func TestPullDeadline(t *testing.T) {
	defer func(p, s time.Duration) { pullPrepare, pullSlack = p, s }(pullPrepare, pullSlack)
	pullPrepare, pullSlack = 300*time.Millisecond, 300*time.Millisecond
	for name, read := range map[string]func(ctx context.Context, sink peer.Sink) error{
		"no header": func(ctx context.Context, _ peer.Sink) error { return waitForCut(ctx) },
		"no data": func(ctx context.Context, sink peer.Sink) error {
			if _, err := sink.Start(1<<20, 1<<20); err != nil { // 1 s at the least rate
				return err
			}
			return waitForCut(ctx)
		},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := pullWith(t, 10*time.Second, nil, read)
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "deadline") {
				t.Errorf("a pull that never ends: %v after %v, want DeadlineExceeded", err, time.Since(start))
			}
		})
	}
}

// TestPullPeerAnswers: a source's node at its stream limits
// (ResourceExhausted) is retried (Unavailable), not rescheduled; one that
// refuses the stream (it serves no data, or no claim of this node asks for
// the source) pins the claim to it (ResourceExhausted), as a plugin whose
// installation serves none does without asking.
func TestPullPeerAnswers(t *testing.T) {
	refuse := func(code codes.Code) func(context.Context, peer.Sink) error {
		return func(context.Context, peer.Sink) error { return status.Error(code, "refused") }
	}
	if err := pullWith(t, 10*time.Second, nil, refuse(codes.ResourceExhausted)); status.Code(err) != codes.Unavailable {
		t.Errorf("a source's node at its limits: %v, want Unavailable", err)
	}
	err := pullWith(t, 10*time.Second, nil, refuse(codes.PermissionDenied))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "its node refused the stream: refused") {
		t.Errorf("a source's node that sends no data: %v, want ResourceExhausted", err)
	}
	err = pullWith(t, 10*time.Second, func(d *Driver) { d.cfg.NoPeerData = true }, func(context.Context, peer.Sink) error {
		t.Error("a pull without peer data")
		return nil
	})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--peer-serve-data=false") {
		t.Errorf("a restore from another node without peer data: %v, want ResourceExhausted", err)
	}
}

// TestPullRefusedByPeerPins: n1 serving no data (--peer-serve-data=false)
// answers n2's pull PermissionDenied, which n2 turns into the pin to n1.
func TestPullRefusedByPeerPins(t *testing.T) {
	requireRoot(t)
	n1, n2, srv := peerNodesWith(t, "loop")
	srv.stop()
	srv.lim.RefuseData = true
	srv.start()
	_, snap := n1.source(4<<20, [][2]int64{{0, 1 << 20}})
	_, err := n2.createPulled("pvc-restore", 4<<20, snapshotSource(snap), nil, 10*time.Second)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--peer-serve-data=false") {
		t.Errorf("restore of n1's snapshot on n2, n1 serving no data: %v, want ResourceExhausted", err)
	}
}
