package driver

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// nodeMetadata is a node's own SnapshotMetadata service for the routing
// tests: for a snapshot ID of its node it streams pages answers naming its
// node (VolumeCapacityBytes = node number), NotFound for any other ID.
type nodeMetadata struct {
	csi.UnimplementedSnapshotMetadataServer
	tag   string
	num   int64
	pages int
	calls int
}

func (m *nodeMetadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, st csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	m.calls++
	if len(req.GetSecrets()) != 0 && m.tag != "n2" {
		return status.Error(codes.Internal, "secrets reached a peer")
	}
	if _, tag := splitID(req.GetSnapshotId()); tag != m.tag {
		return status.Errorf(codes.NotFound, "snapshot %s not found on %s", req.GetSnapshotId(), m.tag)
	}
	for i := range m.pages {
		if err := st.Send(&csi.GetMetadataAllocatedResponse{VolumeCapacityBytes: m.num,
			BlockMetadata: []*csi.BlockMetadata{{ByteOffset: req.GetStartingOffset() + int64(i)<<20, SizeBytes: 4096}}}); err != nil {
			return err
		}
	}
	return nil
}

func (m *nodeMetadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, st csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	m.calls++
	if _, tag := splitID(req.GetTargetSnapshotId()); tag != m.tag {
		return status.Errorf(codes.NotFound, "snapshot %s not found on %s", req.GetTargetSnapshotId(), m.tag)
	}
	return st.Send(&csi.GetMetadataDeltaResponse{VolumeCapacityBytes: m.num, BlockMetadata: []*csi.BlockMetadata{{ByteOffset: 0, SizeBytes: 65536}}})
}

const (
	snapA = "s0123456789abcdef0123456789abcdef" // a store snapshot ID
	snapB = "s00112233445566778899aabbccddeeff"
)

// routedNodes are drivers of nodes n1 and n2, each with its own
// SnapshotMetadata service, n1 serving its PeerService on 127.0.0.1 and n2
// forwarding to it; n2's CSI socket (SnapshotMetadata alone) is served on
// 127.0.0.1 too. They have no store: every ID the tests use is tagged.
func routedNodes(t *testing.T) (n1, n2 *nodeMetadata, client csi.SnapshotMetadataClient) {
	t.Helper()
	n1, n2 = &nodeMetadata{tag: "n1", num: 1, pages: 3}, &nodeMetadata{tag: "n2", num: 2, pages: 2}
	d1 := &Driver{cfg: Config{NodeID: "n1", PeerMetadata: true}, tag: "n1", snapMeta: n1}
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
	peerAddr := serveOn(t, func(ctx context.Context, lis net.Listener) error {
		return peer.NewServer(creds("n1"), d1.PeerService(), peer.Limits{}).Serve(ctx, lis)
	})
	d2 := &Driver{cfg: Config{NodeID: "n2", Peers: peer.NewClient(creds("n2"), peer.Static{"n1": {Node: "n1", Addr: peerAddr}})},
		tag: "n2", snapMeta: n2}
	csiAddr := serveOn(t, func(ctx context.Context, lis net.Listener) error {
		srv := grpc.NewServer()
		d2.registerSnapshotMetadata(srv)
		go func() { <-ctx.Done(); srv.Stop() }()
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	conn, err := grpc.NewClient("passthrough:///"+csiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return n1, n2, csi.NewSnapshotMetadataClient(conn)
}

// serveOn runs serve on a listener of 127.0.0.1 until the test ends.
func serveOn(t *testing.T, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// allocated collects a GetMetadataAllocated answer: the node numbers and
// offsets of its messages.
func allocated(t *testing.T, c csi.SnapshotMetadataClient, req *csi.GetMetadataAllocatedRequest) (nodes []int64, offsets []int64, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.GetMetadataAllocated(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nodes, offsets, nil
		}
		if err != nil {
			return nodes, offsets, err
		}
		nodes = append(nodes, r.GetVolumeCapacityBytes())
		offsets = append(offsets, r.GetBlockMetadata()[0].GetByteOffset())
	}
}

// TestSnapshotMetadataRouting: the SnapshotMetadata service of n2's CSI
// socket answers for n2's snapshots itself and for n1's through n1's
// plugin, whose streamed answer arrives whole and in order; secrets stay
// on n2; a snapshot of a node without a plugin is Unavailable; a call n1
// gets from a peer for a snapshot it does not hold is refused, never
// forwarded again.
func TestSnapshotMetadataRouting(t *testing.T) {
	n1, n2, c := routedNodes(t)
	nodes, offs, err := allocated(t, c, &csi.GetMetadataAllocatedRequest{SnapshotId: snapA + "-n2", StartingOffset: 4096,
		Secrets: map[string]string{"k": "v"}})
	if err != nil || len(nodes) != 2 || nodes[0] != 2 || offs[1] != 4096+1<<20 || n1.calls != 0 {
		t.Fatalf("n2's own snapshot: %v, answers from nodes %v at %v (n1 called %d times); want 2 answers of n2", err, nodes, offs, n1.calls)
	}
	nodes, offs, err = allocated(t, c, &csi.GetMetadataAllocatedRequest{SnapshotId: snapA + "-n1", StartingOffset: 4096,
		Secrets: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatalf("n1's snapshot through n2: %v", err)
	}
	if want := []int64{4096, 4096 + 1<<20, 4096 + 2<<20}; len(nodes) != 3 || nodes[0] != 1 || !slices.Equal(offs, want) {
		t.Errorf("n1's snapshot through n2: nodes %v offsets %v, want 3 answers of n1 at %v", nodes, offs, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: snapB + "-n1", TargetSnapshotId: snapA + "-n1"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetVolumeCapacityBytes() != 1 {
		t.Errorf("delta of n1's snapshots through n2: %v, %v; want n1's answer", r, err)
	}

	calls1, calls2 := n1.calls, n2.calls
	st, err = c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: snapB + "-n2", TargetSnapshotId: snapA + "-n1"})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.NotFound || n1.calls != calls1 || n2.calls != calls2+1 {
		t.Errorf("delta of snapshots of two nodes: %v (n1 called %d more times, n2 %d): want n2's own answer, no forward",
			err, n1.calls-calls1, n2.calls-calls2)
	}

	_, _, err = allocated(t, c, &csi.GetMetadataAllocatedRequest{SnapshotId: snapA + "-n3"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "n3") {
		t.Errorf("a snapshot of a node without a plugin: %v, want Unavailable naming it", err)
	}
	_, _, err = allocated(t, c, &csi.GetMetadataAllocatedRequest{SnapshotId: "not-a-snapshot"})
	if status.Code(err) != codes.NotFound || n2.calls != calls2+2 {
		t.Errorf("an ID of no node: %v (n2 called %d times), want n2's own NotFound", err, n2.calls)
	}

	d1 := &Driver{cfg: Config{NodeID: "n1", PeerMetadata: true}, tag: "n1", snapMeta: n1}
	if _, err := d1.peerMetadata(snapA + "-n2"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a peer call to n1 for n2's snapshot: %v, want InvalidArgument", err)
	}
	if _, err := (&Driver{cfg: Config{NodeID: "n1", PeerMetadata: true}, tag: "n1"}).peerMetadata(snapA + "-n1"); status.Code(err) != codes.Unimplemented {
		t.Errorf("a peer call to a node without the service: %v, want Unimplemented", err)
	}
	if _, _, err := (&Driver{cfg: Config{NodeID: "n2"}, tag: "n2"}).metadataOwner(snapA + "-n1"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("another node's snapshot without a peer channel: %v, want FailedPrecondition", err)
	}
}

// TestPeerMetadataOnlyWhereServed: a plugin answers the snapshot metadata
// calls of peers only when the installation serves snapshot metadata
// (--peer-serve-metadata, which the chart sets with
// snapshotMetadata.enabled): otherwise a peer, a stolen node included,
// gets no block map of its snapshots (PermissionDenied naming the flag).
// Before, every plugin answered them.
func TestPeerMetadataOnlyWhereServed(t *testing.T) {
	n1 := &nodeMetadata{tag: "n1", num: 1, pages: 3}
	d1 := &Driver{cfg: Config{NodeID: "n1"}, tag: "n1", snapMeta: n1}
	if _, err := d1.peerMetadata(snapA + "-n1"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--peer-serve-metadata") {
		t.Errorf("a peer's call for n1's snapshot, n1 serving no metadata: %v; want PermissionDenied naming the flag", err)
	}
	d1.cfg.PeerMetadata = true
	if _, err := d1.peerMetadata(snapA + "-n1"); err != nil {
		t.Errorf("a peer's call for n1's snapshot, n1 serving metadata: %v", err)
	}
}
