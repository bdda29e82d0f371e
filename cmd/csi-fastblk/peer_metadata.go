package main

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/driver"
)

var _ driver.MetadataForwarder = (*peerChannel)(nil)

// GetMetadataAllocated forwards a SnapshotMetadata call for another node's
// snapshot once the channel is up (Unavailable before, which the backup
// application retries).
func (p *peerChannel) GetMetadataAllocated(ctx context.Context, tag string, req *csi.GetMetadataAllocatedRequest, send func(*csi.GetMetadataAllocatedResponse) error) error {
	c := p.client.Load()
	if c == nil {
		return errPeerNotReady
	}
	return c.GetMetadataAllocated(ctx, tag, req, send)
}

// GetMetadataDelta is GetMetadataAllocated for GetMetadataDelta.
func (p *peerChannel) GetMetadataDelta(ctx context.Context, tag string, req *csi.GetMetadataDeltaRequest, send func(*csi.GetMetadataDeltaResponse) error) error {
	c := p.client.Load()
	if c == nil {
		return errPeerNotReady
	}
	return c.GetMetadataDelta(ctx, tag, req, send)
}
