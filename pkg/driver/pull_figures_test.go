package driver

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// countingPeers is n2's peer client, counting the data bytes of streams.
type countingPeers struct {
	Forwarder
	bytes int64
}

func (c *countingPeers) ReadData(ctx context.Context, tag string, req *peer.ReadRequest, sink peer.Sink, idle time.Duration) (peer.Received, error) {
	got, err := c.Forwarder.ReadData(ctx, tag, req, sink, idle)
	c.bytes += got.Bytes
	return got, err
}

// TestPullFigures measures a restore of a 1 GiB volume half written (8 MiB
// of data every 16 MiB) on the snapshot's node and on another node joined
// by the peer channel on 127.0.0.1, unbounded and at the default rate. Run
// with FASTBLK_PULL_FIGURES=1; figures go to docs/benchmarks.md.
func TestPullFigures(t *testing.T) {
	if os.Getenv("FASTBLK_PULL_FIGURES") == "" {
		t.Skip("FASTBLK_PULL_FIGURES unset")
	}
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	counter := &countingPeers{Forwarder: n2.d.cfg.Peers}
	n2.d.cfg.Peers = counter
	var extents [][2]int64
	for off := int64(0); off < 1<<30; off += 16 << 20 {
		extents = append(extents, [2]int64{off, 8 << 20})
	}
	_, snap := n1.source(1<<30, extents)
	want := fileSum(t, n1.file(snap))
	t.Logf("source: %d bytes allocated of 1 GiB", testfs.Allocated(t, n1.file(snap)))
	for _, tc := range []struct {
		name string
		n    *testNode
		rate string
	}{
		{"same node", n1, ""}, {"other node, unbounded", n2, "0"}, {"other node, default rate", n2, ""},
	} {
		name := "pvc-" + map[bool]string{true: "local", false: "pull"}[tc.n == n1] + tc.rate
		params := map[string]string{}
		if tc.rate != "" {
			params[ParamTransferRate] = tc.rate
		}
		counter.bytes = 0
		start := time.Now()
		v, err := tc.n.createFrom(name, 1<<30, snapshotSource(snap), params, 5*time.Minute)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if fileSum(t, tc.n.file(v.GetVolumeId())) != want {
			t.Fatalf("%s: the data differs", tc.name)
		}
		t.Logf("%s: %v, %d data bytes over the channel, target allocates %d bytes", tc.name, took.Round(time.Millisecond),
			counter.bytes, testfs.Allocated(t, tc.n.file(v.GetVolumeId())))
		if _, err := tc.n.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}
