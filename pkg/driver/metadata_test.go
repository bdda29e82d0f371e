package driver

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// metadataNode is a test node (loop backend) serving its CSI services on a
// unix socket in the test's directory, and a client of its
// SnapshotMetadata service.
type metadataNode struct {
	*testNode
	client csi.SnapshotMetadataClient
	conn   *grpc.ClientConn
}

func newMetadataNode(t *testing.T) *metadataNode {
	t.Helper()
	requireRoot(t)
	return serveMetadata(t, newTestNode(t, t.TempDir()))
}

// serveMetadata serves n's CSI services on a socket in its directory.
func serveMetadata(t *testing.T, n *testNode) *metadataNode {
	t.Helper()
	sock := filepath.Join(n.dir, "csi.sock")
	lis, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.d.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &metadataNode{testNode: n, client: csi.NewSnapshotMetadataClient(conn), conn: conn}
}

func (n *metadataNode) write(volID string, off int64, data string) {
	n.t.Helper()
	f, err := os.OpenFile(n.d.store.VolumeFile(storeVolumeID(volID)), os.O_RDWR, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), off); err != nil {
		n.t.Fatal(err)
	}
}

func (n *metadataNode) snapshot(name, volID string) string {
	n.t.Helper()
	resp, err := n.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: volID})
	if err != nil {
		n.t.Fatalf("snapshot %s: %v", name, err)
	}
	return resp.GetSnapshot().GetSnapshotId()
}

// received is what one streamed answer held: its pages' tuples, in order.
type received struct {
	pages    [][]cbt.Extent
	capacity int64
}

func (r received) all() []cbt.Extent { return slices.Concat(r.pages...) }

func (n *metadataNode) allocated(req *csi.GetMetadataAllocatedRequest) (received, error) {
	stream, err := n.client.GetMetadataAllocated(context.Background(), req)
	if err != nil {
		return received{}, err
	}
	var r received
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		if resp.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH {
			n.t.Fatalf("block metadata type %v", resp.GetBlockMetadataType())
		}
		r.capacity = resp.GetVolumeCapacityBytes()
		r.pages = append(r.pages, tuples(resp.GetBlockMetadata()))
	}
}

func (n *metadataNode) delta(req *csi.GetMetadataDeltaRequest) (received, error) {
	stream, err := n.client.GetMetadataDelta(context.Background(), req)
	if err != nil {
		return received{}, err
	}
	var r received
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		if resp.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH {
			n.t.Fatalf("block metadata type %v", resp.GetBlockMetadataType())
		}
		r.capacity = resp.GetVolumeCapacityBytes()
		r.pages = append(r.pages, tuples(resp.GetBlockMetadata()))
	}
}

func tuples(bm []*csi.BlockMetadata) []cbt.Extent {
	var out []cbt.Extent
	for _, b := range bm {
		out = append(out, cbt.Extent{Offset: b.GetByteOffset(), Length: b.GetSizeBytes()})
	}
	return out
}

const mib = 1 << 20

// TestSnapshotMetadataOverGRPC drives both RPCs through a real gRPC server
// on a unix socket: answers, paging, starting_offset, and error codes.
func TestSnapshotMetadataOverGRPC(t *testing.T) {
	n := newMetadataNode(t)
	vol := n.create("v", 16*mib, nil)
	for i := range int64(8) { // 8 separate 4 KiB data runs, 1 MiB apart
		n.write(vol, i*mib, "data")
	}
	base := n.snapshot("base", vol)
	n.write(vol, 2*mib, "changed")
	n.write(vol, 10*mib+4096, "new")
	target := n.snapshot("target", vol)
	other := n.snapshot("other", n.create("w", 16*mib, nil))

	var want []cbt.Extent
	for i := range int64(8) {
		want = append(want, cbt.Extent{Offset: i * mib, Length: 4096})
	}
	t.Run("allocated", func(t *testing.T) {
		r, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.all(); !slices.Equal(got, want) || r.capacity != 16*mib {
			t.Fatalf("allocated = %v (capacity %d), want %v", got, r.capacity, want)
		}
	})
	t.Run("allocated in pages of max_results", func(t *testing.T) {
		r, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, MaxResults: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.pages) != 3 || len(r.pages[0]) != 3 || len(r.pages[2]) != 2 || !slices.Equal(r.all(), want) {
			t.Fatalf("pages = %v", r.pages)
		}
	})
	t.Run("allocated from a starting offset", func(t *testing.T) {
		// Tuples ending before the offset are left out; one spanning it
		// starts there.
		r, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, StartingOffset: 5*mib + 100})
		if err != nil {
			t.Fatal(err)
		}
		wantFrom := []cbt.Extent{{Offset: 5*mib + 100, Length: 4096 - 100}, {Offset: 6 * mib, Length: 4096}, {Offset: 7 * mib, Length: 4096}}
		if got := r.all(); !slices.Equal(got, wantFrom) {
			t.Fatalf("allocated from 5 MiB+100 = %v, want %v", got, wantFrom)
		}
		r, err = n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, StartingOffset: 16 * mib})
		if err != nil || len(r.all()) != 0 || len(r.pages) != 1 || r.capacity != 16*mib {
			t.Fatalf("allocated from the end = %v (capacity %d), %v; want one page without tuples", r.pages, r.capacity, err)
		}
	})
	t.Run("delta", func(t *testing.T) {
		r, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
		if err != nil {
			t.Fatal(err)
		}
		wantDelta := []cbt.Extent{{Offset: 2 * mib, Length: 4096}, {Offset: 10*mib + 4096, Length: 4096}}
		if got := r.all(); !slices.Equal(got, wantDelta) || r.capacity != 16*mib {
			t.Fatalf("delta = %v (capacity %d), want %v", got, r.capacity, wantDelta)
		}
		r, err = n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: 3 * mib, MaxResults: 1})
		if err != nil || !slices.Equal(r.all(), wantDelta[1:]) || len(r.pages) != 1 {
			t.Fatalf("delta from 3 MiB = %v, %v", r.pages, err)
		}
	})
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"allocated without a snapshot id", func() error { _, err := n.allocated(&csi.GetMetadataAllocatedRequest{}); return err }, codes.InvalidArgument},
		{"allocated with a negative offset", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, StartingOffset: -1})
			return err
		}, codes.OutOfRange},
		{"allocated past the end", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, StartingOffset: 16*mib + 1})
			return err
		}, codes.OutOfRange},
		{"allocated with negative max_results", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: base, MaxResults: -1})
			return err
		}, codes.InvalidArgument},
		{"allocated of a missing snapshot", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: "s00000000000000000000000000000000-n1"})
			return err
		}, codes.NotFound},
		{"allocated of a malformed id", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: "../../etc"})
			return err
		}, codes.NotFound},
		{"allocated of another node's snapshot", func() error {
			_, err := n.allocated(&csi.GetMetadataAllocatedRequest{SnapshotId: swapTag(base, "n2")})
			return err
		}, codes.FailedPrecondition},
		{"delta without a base", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{TargetSnapshotId: target})
			return err
		}, codes.InvalidArgument},
		{"delta without a target", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base})
			return err
		}, codes.InvalidArgument},
		{"delta of different volumes", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: other})
			return err
		}, codes.InvalidArgument},
		{"delta of snapshots on different nodes", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: swapTag(base, "n2"), TargetSnapshotId: swapTag(target, "n3")})
			return err
		}, codes.InvalidArgument},
		{"delta of another node's snapshots", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: swapTag(base, "n2"), TargetSnapshotId: swapTag(target, "n2")})
			return err
		}, codes.FailedPrecondition},
		{"delta of a missing snapshot", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: "s00000000000000000000000000000000-n1"})
			return err
		}, codes.NotFound},
		{"delta with a negative offset", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: -4096})
			return err
		}, codes.OutOfRange},
		{"delta past the end", func() error {
			_, err := n.delta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: 17 * mib})
			return err
		}, codes.OutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.want {
				t.Fatalf("code = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a cancelled call ends its stream", func(t *testing.T) {
		// More single-tuple messages than the stream's flow-control
		// window holds, so the server is still sending at the cancel.
		many := n.create("many", 64*mib, nil)
		for i := range int64(8192) {
			n.write(many, i*8192, "x")
		}
		snap := n.snapshot("many", many)
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := n.client.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: snap, MaxResults: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		for {
			if _, err := stream.Recv(); err != nil {
				if status.Code(err) != codes.Canceled {
					t.Fatalf("err = %v, want Canceled", err)
				}
				return
			}
		}
	})
}

// swapTag gives a CSI ID the tag of another node.
func swapTag(id, tag string) string {
	storeID, _ := splitID(id)
	return storeID + "-" + tag
}

func TestIdentityAdvertisesSnapshotMetadata(t *testing.T) {
	resp, err := (&Identity{d: &Driver{}}).GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE {
			return
		}
	}
	t.Fatalf("capabilities %v lack SNAPSHOT_METADATA_SERVICE", resp.GetCapabilities())
}
