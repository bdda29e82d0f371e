package peer

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// metadataRecorder is a recorder that also answers SnapshotMetadata calls:
// pages answers of two ranges each for snapshot "s1-n1", NotFound for any
// other, and remembers the requests and callers.
type metadataRecorder struct {
	recorder
	mu      sync.Mutex
	reqs    []any
	callers []Identity
	pages   int
}

func (m *metadataRecorder) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, st csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	caller, _ := Caller(st.Context())
	m.mu.Lock()
	m.reqs, m.callers = append(m.reqs, req), append(m.callers, caller)
	m.mu.Unlock()
	if req.GetSnapshotId() != "s1-n1" {
		return status.Errorf(codes.NotFound, "snapshot %s not found", req.GetSnapshotId())
	}
	for i := range m.pages {
		off := req.GetStartingOffset() + int64(i)*2<<20
		if err := st.Send(&csi.GetMetadataAllocatedResponse{
			BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: 64 << 20,
			BlockMetadata: []*csi.BlockMetadata{{ByteOffset: off, SizeBytes: 4096}, {ByteOffset: off + 1<<20, SizeBytes: 8192}},
		}); err != nil {
			return err
		}
	}
	return nil
}

func (m *metadataRecorder) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, st csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	caller, _ := Caller(st.Context())
	m.mu.Lock()
	m.reqs, m.callers = append(m.reqs, req), append(m.callers, caller)
	m.mu.Unlock()
	if req.GetBaseSnapshotId() == "" {
		return status.Error(codes.InvalidArgument, "no base snapshot")
	}
	return st.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_FIXED_LENGTH, VolumeCapacityBytes: 64 << 20,
		BlockMetadata: []*csi.BlockMetadata{{ByteOffset: 0, SizeBytes: 65536}}})
}

// TestForwardMetadata: a SnapshotMetadata call reaches the peer of the tag,
// whose streamed answer comes back message by message, in order; secrets
// stay behind, the caller is known there, refusals come back with their
// code, an error of the receiving side ends the stream with it, and a peer
// without a MetadataHandler answers Unimplemented.
func TestForwardMetadata(t *testing.T) {
	ca := newCA(t)
	h := &metadataRecorder{pages: 3}
	addr := serve(t, newCreds(t, ca, n1), h)
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	ctx := callCtx(t)

	var got []*csi.GetMetadataAllocatedResponse
	err := c.GetMetadataAllocated(ctx, "n1", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n1", StartingOffset: 4096, MaxResults: 2,
		Secrets: map[string]string{"token": "s3cret"}}, func(r *csi.GetMetadataAllocatedResponse) error {
		got = append(got, r)
		return nil
	})
	if err != nil || len(got) != 3 {
		t.Fatalf("GetMetadataAllocated: %v, %d answers; want 3", err, len(got))
	}
	for i, r := range got {
		if off := r.GetBlockMetadata()[0].GetByteOffset(); off != 4096+int64(i)*2<<20 || r.GetVolumeCapacityBytes() != 64<<20 {
			t.Errorf("answer %d: %v, want offset %d first", i, r, 4096+int64(i)*2<<20)
		}
	}
	req := h.reqs[0].(*csi.GetMetadataAllocatedRequest)
	if len(req.GetSecrets()) != 0 || req.GetMaxResults() != 2 || req.GetStartingOffset() != 4096 {
		t.Errorf("the peer got %v: want no secrets, max_results 2, starting_offset 4096", req)
	}
	if h.callers[0] != n2 {
		t.Errorf("caller %v, want %v", h.callers[0], n2)
	}

	err = c.GetMetadataAllocated(ctx, "n1", &csi.GetMetadataAllocatedRequest{SnapshotId: "s2-n1"}, func(*csi.GetMetadataAllocatedResponse) error { return nil })
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "s2-n1") {
		t.Errorf("unknown snapshot: %v, want the peer's NotFound", err)
	}
	var deltas int
	err = c.GetMetadataDelta(ctx, "n1", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s0-n1", TargetSnapshotId: "s1-n1"},
		func(r *csi.GetMetadataDeltaResponse) error { deltas += len(r.GetBlockMetadata()); return nil })
	if err != nil || deltas != 1 {
		t.Errorf("GetMetadataDelta: %v, %d ranges; want 1", err, deltas)
	}
	err = c.GetMetadataDelta(ctx, "n1", &csi.GetMetadataDeltaRequest{TargetSnapshotId: "s1-n1"}, func(*csi.GetMetadataDeltaResponse) error { return nil })
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("delta without a base: %v, want the peer's InvalidArgument", err)
	}
	errGone := errors.New("the sidecar went away")
	err = c.GetMetadataAllocated(ctx, "n1", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n1"},
		func(*csi.GetMetadataAllocatedResponse) error { return errGone })
	if !errors.Is(err, errGone) {
		t.Errorf("a failing receiver: %v, want its error", err)
	}

	plain := serve(t, newCreds(t, ca, n3), &recorder{})
	c = NewClient(newCreds(t, ca, n2), Static{"n3": {Node: "n3", Addr: plain}})
	err = c.GetMetadataAllocated(ctx, "n3", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n3"}, func(*csi.GetMetadataAllocatedResponse) error { return nil })
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("a peer without snapshot metadata: %v, want Unimplemented", err)
	}
}

// TestForwardMetadataWithinLimits: a metadata stream takes a place among
// the serving node's streams, so a peer at its limit is refused
// (ResourceExhausted) rather than served without bound.
func TestForwardMetadataWithinLimits(t *testing.T) {
	ca := newCA(t)
	h := &metadataRecorder{pages: 1}
	addr, srv := serveWithin(t, newCreds(t, ca, n1), h, Limits{MaxStreams: 1, MaxStreamsPerPeer: 1})
	release, err := srv.svc.streams.admit(n2.Node) // a data stream of n2 in flight
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	ctx := callCtx(t)
	none := func(*csi.GetMetadataAllocatedResponse) error { return nil }
	if err := c.GetMetadataAllocated(ctx, "n1", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n1"}, none); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("at the limit: %v, want ResourceExhausted", err)
	}
	release()
	if err := c.GetMetadataAllocated(ctx, "n1", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n1"}, none); err != nil {
		t.Errorf("below the limit: %v", err)
	}
}
