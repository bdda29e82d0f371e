package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Volume and snapshot IDs as Kubernetes sees them name the node that holds
// the object: the store's ID, a dash and the node's tag, 8 hex digits of
// sha256 of the node ID ("v0123…ef-1a2b3c4d"). A node-local object exists on
// one node only, and every plugin gets requests for objects of other nodes:
// a restore or clone whose pod the scheduler placed on another node than
// its source, a ControllerModifyVolume from the external-resizer's one
// leader. The tag lets a plugin answer "on another node" (and, for a
// restore, ResourceExhausted, on which the external-provisioner sends the
// claim back to the scheduler) rather than NotFound, and keep NotFound for
// what exists nowhere. IDs without a tag (volumes made before tags) are
// looked up here as they are.
const nodeTagLen = 8

// nodeTag is the tag of the node nodeID.
func nodeTag(nodeID string) string {
	sum := sha256.Sum256([]byte("csi-fastblk node " + nodeID))
	return hex.EncodeToString(sum[:nodeTagLen/2])
}

// publicID is the CSI ID of this node's store object id ("" stays "").
func (d *Driver) publicID(id string) string {
	if id == "" {
		return ""
	}
	return id + "-" + d.tag
}

// splitID splits a CSI ID into the store's ID and the node tag ("" for an
// ID without one, or one that is not ours: the store answers NotFound).
func splitID(id string) (storeID, tag string) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 || len(id)-i-1 != nodeTagLen || !blockdev.ValidID(id[:i]) || !isLowerHex(id[i+1:]) {
		return id, ""
	}
	return id[:i], id[i+1:]
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// localID maps a CSI ID to this node's store ID. An ID tagged with another
// node gives a status with code and a message that says where the object
// is not: what the caller should do differs per RPC.
func (d *Driver) localID(id, kind string, code codes.Code) (string, error) {
	storeID, tag := splitID(id)
	if tag == "" || tag == d.tag {
		return storeID, nil
	}
	return "", status.Errorf(code, "%s %s lives on another node (node tag %s), not on node %s (tag %s): "+
		"node-local %ss are only served by the plugin on their own node", kind, id, tag, d.cfg.NodeID, d.tag, kind)
}

// storeVolumeID is the store's ID of a volume in a node RPC. Kubelet only
// asks the plugin of the node a volume's PV is pinned to, so the tag is not
// checked (NodeUnpublishVolume must also work for a volume the store no
// longer knows).
func storeVolumeID(id string) string {
	storeID, _ := splitID(id)
	return storeID
}
