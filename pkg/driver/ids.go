package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Volume and snapshot IDs as Kubernetes sees them name the node that holds
// the object: the store's ID, a dash and the node's tag, which is the node
// ID when the whole fits the CSI limit of 128 bytes (node IDs of up to 94
// bytes; "v0123…ef-worker-3") and otherwise "#" and 8 hex digits of sha256
// of the node ID. A node-local object exists on one node only, and every
// plugin gets requests for objects of other nodes: a restore or clone whose
// pod the scheduler placed on another node than its source, a
// ControllerModifyVolume from the external-resizer's one leader. The tag
// lets a plugin find the node that serves an object (for a restore or
// clone, the node to pull the data from, or without the peer channel
// ResourceExhausted, on which the external-provisioner sends the claim
// back to the scheduler) or answer "on node X" rather than NotFound, and
// keep NotFound for what exists nowhere. IDs
// without a tag (volumes made before tags) are looked up here as they are.
const (
	storeIDLen  = 33 // blockdev's IDs: a kind letter and 32 hex digits
	maxIDLen    = 128
	hashTagLen  = 9 // "#" and 8 hex digits
	maxNodeInID = maxIDLen - storeIDLen - 1
)

// nodeTag is the tag of the node nodeID.
func nodeTag(nodeID string) string {
	if len(nodeID) <= maxNodeInID && !strings.HasPrefix(nodeID, "#") {
		return nodeID
	}
	sum := sha256.Sum256([]byte("csi-fastblk node " + nodeID))
	return "#" + hex.EncodeToString(sum[:(hashTagLen-1)/2])
}

// publicID is the CSI ID of this node's store object id ("" stays "").
func (d *Driver) publicID(id string) string {
	if id == "" {
		return ""
	}
	return id + "-" + d.tag
}

// HoldsSnapshot reports whether the snapshot of CSI ID id is this node's:
// tagged with this node, or untagged and in this node's store.
func (d *Driver) HoldsSnapshot(id string) bool {
	storeID, tag := splitID(id)
	if !blockdev.IsSnapshotID(storeID) {
		return false
	}
	if tag != "" {
		return tag == d.tag
	}
	_, err := d.store.Snapshot(storeID)
	return err == nil
}

// HoldsVolume reports whether the volume of CSI ID id is this node's:
// tagged with this node, or untagged and in this node's store.
func (d *Driver) HoldsVolume(id string) bool {
	storeID, tag := splitID(id)
	if !blockdev.IsVolumeID(storeID) {
		return false
	}
	if tag != "" {
		return tag == d.tag
	}
	_, err := d.store.Volume(storeID)
	return err == nil
}

// HoldsGroupSnapshot reports whether the group snapshot of CSI ID id is
// this node's (group IDs are always tagged).
func (d *Driver) HoldsGroupSnapshot(id string) bool {
	storeID, tag := splitID(id)
	return blockdev.IsGroupSnapshotID(storeID) && tag == d.tag
}

// splitID splits a CSI ID into the store's ID and the node tag ("" for an
// ID without one, or one that is not ours: the store answers NotFound).
func splitID(id string) (storeID, tag string) {
	if len(id) <= storeIDLen+1 || id[storeIDLen] != '-' || !blockdev.ValidID(id[:storeIDLen]) {
		return id, ""
	}
	return id[:storeIDLen], id[storeIDLen+1:]
}

// localID maps a CSI ID to this node's store ID. An ID tagged with another
// node gives a status with code and a message that names that node (or its
// tag) and how to reach it: what the caller should do differs per RPC.
func (d *Driver) localID(id, kind string, code codes.Code) (string, error) {
	storeID, tag := splitID(id)
	if tag == "" || tag == d.tag {
		return storeID, nil
	}
	return "", status.Errorf(code, "%s %s lives on %s, not on node %s: node-local %ss are only served by the plugin on their own node",
		kind, id, tagNode(tag), d.cfg.NodeID, kind)
}

// tagNode names the node of a tag for messages.
func tagNode(tag string) string {
	if strings.HasPrefix(tag, "#") {
		return "another node (tag " + tag + ")"
	}
	return "node " + tag
}

// sourceElsewhere is CreateVolume's answer for a source on another node
// when the peer channel is off: ResourceExhausted, on which the external-provisioner sends the claim back
// to the scheduler. The scheduler knows nothing of the source's node and
// may pick the same node again; the message, an event on the claim, says
// where the pod must run.
func (d *Driver) sourceElsewhere(kind, id string) error {
	_, tag := splitID(id)
	hint := "run the pod that uses the new volume on the source's node"
	if !strings.HasPrefix(tag, "#") {
		hint = fmt.Sprintf("run the pod that uses the new volume on node %s (nodeSelector %s: %s)", tag, TopologyKey, tag)
	}
	return status.Errorf(codes.ResourceExhausted, "source %s %s lives on %s, not on node %s: a node-local %s is restored or cloned only on its own node; %s",
		kind, id, tagNode(tag), d.cfg.NodeID, kind, hint)
}

// storeVolumeID is the store's ID of a volume in a node RPC. Kubelet only
// asks the plugin of the node a volume's PV is pinned to, so the tag is not
// checked (NodeUnpublishVolume must also work for a volume the store no
// longer knows).
func storeVolumeID(id string) string {
	storeID, _ := splitID(id)
	return storeID
}
