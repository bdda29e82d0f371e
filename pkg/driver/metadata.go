package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// SnapshotMetadata serves the CSI SnapshotMetadata service: a snapshot's
// allocated ranges, read from its file's extent map, and the ranges
// changed between two snapshots of one volume, from the change records
// the ublk data path keeps with each snapshot or, where those cannot be
// trusted, and always on the loop backend, by comparing the two files
// (store.Delta).
//
// Ranges are VARIABLE_LENGTH extents: the store's answers are extents
// already (runs of data, merged runs of 64 KiB chunks or 4 KiB blocks),
// so a run of many blocks is one tuple rather than one per block, and a
// backup tool reads it with one request.
type SnapshotMetadata struct {
	csi.UnimplementedSnapshotMetadataServer
	d *Driver
}

// defaultMaxResults is the page size (tuples per message) when the
// request leaves it to the plugin: about 16 KiB of message.
const defaultMaxResults = 1024

func (s *SnapshotMetadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	if req.GetSnapshotId() == "" {
		return invalid("snapshot ID is missing")
	}
	if err := checkPaging(req.GetStartingOffset(), req.GetMaxResults()); err != nil {
		return err
	}
	id, err := s.d.metadataSnapshot(req.GetSnapshotId())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	exts, size, err := s.d.store.Allocated(ctx, id)
	if err != nil {
		return toStatus(fmt.Errorf("allocated ranges of snapshot %s: %w", id, err))
	}
	return sendPages(ctx, exts, size, req.GetStartingOffset(), req.GetMaxResults(), func(page []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{
			BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: page,
		})
	})
}

func (s *SnapshotMetadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	switch {
	case req.GetBaseSnapshotId() == "":
		return invalid("base snapshot ID is missing")
	case req.GetTargetSnapshotId() == "":
		return invalid("target snapshot ID is missing")
	}
	if err := checkPaging(req.GetStartingOffset(), req.GetMaxResults()); err != nil {
		return err
	}
	_, baseTag := splitID(req.GetBaseSnapshotId())
	_, targetTag := splitID(req.GetTargetSnapshotId())
	if baseTag != "" && targetTag != "" && baseTag != targetTag {
		// A volume and its snapshots live on one node.
		return invalid("snapshots %s and %s live on different nodes: they are not snapshots of one volume",
			req.GetBaseSnapshotId(), req.GetTargetSnapshotId())
	}
	base, err := s.d.metadataSnapshot(req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	target, err := s.d.metadataSnapshot(req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	_, tracked := s.d.backend.(changeTracker)
	exts, size, how, err := s.d.store.Delta(ctx, base, target, tracked)
	if err != nil {
		return toStatus(fmt.Errorf("delta of snapshots %s and %s: %w", base, target, err))
	}
	klog.V(2).InfoS("snapshot delta", "baseSnapshotID", base, "targetSnapshotID", target, "method", how,
		"extents", len(exts), "bytes", cbt.Total(exts))
	return sendPages(ctx, exts, size, req.GetStartingOffset(), req.GetMaxResults(), func(page []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{
			BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: page,
		})
	})
}

// checkPaging checks the paging fields: the spec answers a negative
// starting_offset with OUT_OF_RANGE (one past the volume's size is checked
// once the size is known, in sendPages), a negative max_results is an
// invalid argument.
func checkPaging(offset int64, maxResults int32) error {
	if offset < 0 {
		return status.Errorf(codes.OutOfRange, "starting offset %d is negative", offset)
	}
	if maxResults < 0 {
		return invalid("max_results %d is negative", maxResults)
	}
	return nil
}

// metadataSnapshot maps the CSI ID of a snapshot a SnapshotMetadata call
// names to this node's store ID. Another node's snapshot goes to
// snapshotElsewhere.
func (d *Driver) metadataSnapshot(id string) (string, error) {
	storeID, tag := splitID(id)
	if tag != "" && tag != d.tag {
		return "", d.snapshotElsewhere(id)
	}
	return storeID, nil
}

// snapshotElsewhere answers a SnapshotMetadata call for a snapshot of
// another node, which alone holds its data: FailedPrecondition, as other
// controller calls for another node's objects are answered without the
// peer channel (peer.go). This is the hook where forwarding the call to
// that node's plugin belongs.
func (d *Driver) snapshotElsewhere(id string) error {
	_, err := d.localID(id, "snapshot", codes.FailedPrecondition)
	return status.Errorf(codes.FailedPrecondition, "snapshot metadata: %s; %s", status.Convert(err).Message(), d.noPeers())
}

// sendPages streams the normalized exts that end after offset (one that
// spans it is clipped to start there) in pages of at most maxResults
// tuples (0: defaultMaxResults); with none, one page without tuples, so
// that the caller still learns the volume's capacity. An offset past size
// is OUT_OF_RANGE. ctx is checked before each page.
func sendPages(ctx context.Context, exts []cbt.Extent, size, offset int64, maxResults int32, send func([]*csi.BlockMetadata) error) error {
	if offset > size {
		return status.Errorf(codes.OutOfRange, "starting offset %d is past the volume's %d bytes", offset, size)
	}
	exts = cbt.Clip(exts, offset, size)
	n := int(maxResults)
	if n == 0 {
		n = defaultMaxResults
	}
	for first := true; first || len(exts) > 0; first = false {
		if err := ctx.Err(); err != nil {
			return toStatus(err)
		}
		k := min(n, len(exts))
		page := make([]*csi.BlockMetadata, k)
		for i, e := range exts[:k] {
			page[i] = &csi.BlockMetadata{ByteOffset: e.Offset, SizeBytes: e.Length}
		}
		if err := send(page); err != nil {
			return err
		}
		exts = exts[k:]
	}
	return nil
}
