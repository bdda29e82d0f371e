package driver

import (
	"context"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// peerNodes are the test nodes n1 (with the backend kind) and n2 (loop)
// joined by the peer channel over mutual TLS on 127.0.0.1: n1 serves its
// PeerService, n2 forwards to it. stop ends n1's peer server.
func peerNodes(t *testing.T, kind string) (n1, n2 *testNode, stop func()) {
	n1, n2, srv := peerNodesWith(t, kind)
	return n1, n2, srv.stop
}

// peerServer is n1's peer server, which a test may stop, kill and start
// again on the same address.
type peerServer struct {
	t      testing.TB
	n      *testNode
	creds  *peer.Credentials
	lim    peer.Limits
	opts   []grpc.ServerOption
	addr   string
	srv    *peer.Server
	cancel context.CancelFunc
	done   chan error
}

// peerNodesWith is peerNodes with options for n1's server (interceptors).
func peerNodesWith(t *testing.T, kind string, opts ...grpc.ServerOption) (n1, n2 *testNode, srv *peerServer) {
	t.Helper()
	return peerNodesIn(t, kind, t.TempDir(), opts...)
}

// peerNodesIn is peerNodesWith with n2's directory dir2.
func peerNodesIn(t *testing.T, kind, dir2 string, opts ...grpc.ServerOption) (n1, n2 *testNode, srv *peerServer) {
	t.Helper()
	n1 = newTestNodeWith(t, t.TempDir(), "n1", kind)
	n2 = newTestNodeOn(t, dir2, "n2")
	ca, err := peer.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	creds := func(node string) *peer.Credentials {
		c, err := peer.NewCredentials(ca, peer.Identity{Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node", Node: node}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	srv = &peerServer{t: t, n: n1, creds: creds("n1"), opts: append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(LogAndRecover)}, opts...),
		addr: "127.0.0.1:0"}
	srv.start()
	t.Cleanup(srv.stop)
	t.Cleanup(func() { // before n1 stops: no copy outlives the test
		for _, p := range n2.d.pulls.list() {
			n2.d.cancelPull(context.Background(), p.id)
		}
	})
	n2.d.cfg.Peers = peer.NewClient(creds("n2"), peer.Static{NodeTag("n1"): {Node: "n1", Addr: srv.addr}})
	return n1, n2, srv
}

// start serves n1's PeerService on the server's address.
func (s *peerServer) start() {
	s.t.Helper()
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	s.done = make(chan error, 1)
	s.srv = peer.NewServerWith(s.creds, s.n.d.PeerService(), s.lim, s.opts...)
	go func(done chan error) { done <- s.srv.Serve(ctx, lis) }(s.done)
}

// stop ends the server as the plugin's shutdown does. Idempotent.
func (s *peerServer) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	if err := <-s.done; err != nil {
		s.t.Errorf("peer server: %v", err)
	}
	s.cancel = nil
}

// kill cuts every connection and stream at once, as a crash does.
func (s *peerServer) kill() {
	s.srv.Stop()
	s.stop()
}

// TestForwardToOwningNode: ControllerExpandVolume and
// ControllerModifyVolume that reach n2 (where the external-resizer's
// leader runs) for n1's volume are answered by n1's plugin: the volume
// grows on n1, a repeated call gives the same answer, n1's refusal of
// rate limits (the loop backend) comes back as n1 gave it, naming n1.
// Before forwarding, both were FailedPrecondition on n2.
func TestForwardToOwningNode(t *testing.T) {
	requireRoot(t)
	n1, n2, stop := peerNodes(t, "loop")
	ctx := context.Background()
	vol := n1.create("pvc-forward", 1<<20, nil)

	for i := 0; i < 2; i++ { // idempotent: the same answer twice
		resp, err := n2.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}})
		if err != nil || resp.GetCapacityBytes() != 4<<20 || !resp.GetNodeExpansionRequired() {
			t.Fatalf("expand %d of n1's volume on n2: %v, %v; want 4 MiB from n1", i, resp, err)
		}
	}
	if v, err := n1.d.store.Volume(storeVolumeID(vol)); err != nil || v.SizeBytes != 4<<20 {
		t.Fatalf("n1's volume after the forwarded expansion: %+v, %v", v, err)
	}

	_, err := n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: map[string]string{ParamMaxIOPS: "1000"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "on node n1") || !strings.Contains(err.Error(), "need the ublk backend") {
		t.Errorf("modify of n1's volume on n2: %v, want n1's InvalidArgument naming n1", err)
	}
	if _, err := n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: map[string]string{ParamMaxIOPS: "0"}}); err != nil {
		t.Errorf("modify of n1's volume to no limit on n2: %v", err)
	}
	if v, _ := n1.d.store.Volume(storeVolumeID(vol)); v.MutableParams[ParamMaxIOPS] != "0" {
		t.Errorf("n1's record after the forwarded modify: %v", v.MutableParams)
	}
	// A volume that exists nowhere, tagged for n1: n1's NotFound.
	gone := n1.d.publicID(blockdev.VolumeID("gone"))
	if _, err := n2.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: gone, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}}); status.Code(err) != codes.NotFound {
		t.Errorf("expand of a missing n1 volume on n2: %v, want n1's NotFound", err)
	}
	// A node without a known plugin, and n1's plugin gone: Unavailable,
	// which the resizer retries.
	other := blockdev.VolumeID("x") + "-n3"
	if _, err := n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: other}); status.Code(err) != codes.Unavailable {
		t.Errorf("modify of a volume of n3 on n2: %v, want Unavailable", err)
	}
	stop()
	if _, err := n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol}); status.Code(err) != codes.Unavailable {
		t.Errorf("modify with n1's plugin down: %v, want Unavailable", err)
	}
}

// TestForwardedModifyReachesUblkDevice: a VolumeAttributesClass change
// that reaches n2 (the external-resizer's leader) for a volume staged on
// n1, whose backend is ublk, changes the rate limits of n1's live device
// at once, and lifting them does too (hack/vm step 41 runs it).
func TestForwardedModifyReachesUblkDevice(t *testing.T) {
	testgate.RequireUblk(t)
	n1, n2, _ := peerNodes(t, "ublk")
	ctx := context.Background()
	vol := n1.create("pvc-paced", 16<<20, nil)
	n1.stage(vol, blockCap(snw), false)
	limits := func() qos.Limits {
		t.Helper()
		devs, err := n1.backend.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range devs {
			if d.VolumeID == storeVolumeID(vol) {
				return d.Limits
			}
		}
		t.Fatalf("no device of %s on n1 among %+v", vol, devs)
		return qos.Limits{}
	}
	for _, tc := range []struct {
		params map[string]string
		want   qos.Limits
	}{
		{map[string]string{ParamMaxIOPS: "500", ParamMaxBandwidth: "8Mi"}, qos.Limits{IOPS: 500, BytesPerSecond: 8 << 20}},
		{map[string]string{ParamMaxIOPS: "0", ParamMaxBandwidth: "0"}, qos.Limits{}},
	} {
		if _, err := n2.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: tc.params}); err != nil {
			t.Fatalf("modify %v of n1's volume on n2: %v", tc.params, err)
		}
		if got := limits(); got != tc.want {
			t.Errorf("n1's live device after the forwarded modify %v: limits %+v, want %+v", tc.params, got, tc.want)
		}
	}
}

// TestPeerServiceServesOwnVolumesOnly: a peer's call names a volume of
// this node by its full ID, or it is refused before it reaches the store:
// other nodes' volumes (never forwarded again), snapshots, untagged or
// malformed IDs.
func TestPeerServiceServesOwnVolumesOnly(t *testing.T) {
	requireRoot(t)
	n1 := newTestNodeOn(t, t.TempDir(), "n1")
	vol := n1.create("pvc-own", 1<<20, nil)
	svc := n1.d.PeerService()
	ctx := context.Background()
	for _, id := range []string{"", storeVolumeID(vol), blockdev.VolumeID("x") + "-n2", blockdev.SnapshotID("x") + "-n1",
		"../../etc/passwd-n1", strings.Repeat("v", 33) + "-n1", strings.ToUpper(vol[:33]) + "-n1", vol + "x"} {
		_, err := svc.ModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("peer ModifyVolume(%q): %v, want InvalidArgument", id, err)
		}
		_, err = svc.ExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("peer ExpandVolume(%q): %v, want InvalidArgument", id, err)
		}
	}
	if resp, err := svc.ExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}}); err != nil || resp.GetCapacityBytes() != 2<<20 {
		t.Errorf("peer ExpandVolume of n1's own volume: %v, %v", resp, err)
	}
}

// FuzzPeerRequest: whatever bytes a peer sends are decoded by gRPC's codec
// into a CSI request for PeerService (proto.Unmarshal), which serves it on
// this node's own volume or refuses it: nothing panics, and no file of the
// data directory appears, disappears or is renamed whatever the peer
// names.
func FuzzPeerRequest(f *testing.F) {
	requireRoot(f)
	n1 := newTestNodeOn(f, f.TempDir(), "n1")
	vol := n1.create("pvc-fuzz", 1<<20, nil)
	files := func() string {
		var names []string
		filepath.WalkDir(n1.dir, func(p string, _ fs.DirEntry, _ error) error {
			names = append(names, p)
			return nil
		})
		return strings.Join(names, "\n")
	}
	before := files()
	seed := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	for _, id := range []string{vol, "../../etc/passwd-n1", storeVolumeID(vol) + "-n2", storeVolumeID(vol)} {
		f.Add(false, seed(&csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{ParamMaxIOPS: "0"}}))
		f.Add(true, seed(&csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}}))
	}
	svc := n1.d.PeerService()
	f.Fuzz(func(t *testing.T, expand bool, b []byte) {
		ctx := context.Background()
		if expand {
			req := new(csi.ControllerExpandVolumeRequest)
			if proto.Unmarshal(b, req) != nil {
				return
			}
			if req.GetCapacityRange().GetRequiredBytes() > 64<<20 || req.GetCapacityRange().GetLimitBytes() > 64<<20 {
				return // a real expansion of the test volume: not about paths
			}
			svc.ExpandVolume(ctx, req)
		} else {
			req := new(csi.ControllerModifyVolumeRequest)
			if proto.Unmarshal(b, req) != nil {
				return
			}
			svc.ModifyVolume(ctx, req)
		}
		if now := files(); now != before {
			t.Fatalf("the data directory changed:\nbefore\n%s\nafter\n%s", before, now)
		}
	})
}
