package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
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
//
// The objects of a named device class (classes.go) carry the class
// between the store's ID and the tag, set off by dots, so that every later
// call, and a restarted plugin, knows the class from the ID alone:
// "v0123…ef.nvme.worker-3". The default class's keep the shape above, so
// volumes made before classes keep their IDs. A class name has no dot and
// a tag may have some: the first two dots end the store's ID and the class.
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

// publicID is the CSI ID of this node's store object id ("" stays ""), in
// the class that holds it.
func (d *Driver) publicID(id string) string {
	_, class := d.store.of(id)
	return d.publicIDIn(id, class)
}

// publicIDIn is the CSI ID of this node's store object id of class.
func (d *Driver) publicIDIn(id, class string) string {
	return formatID(id, class, d.tag)
}

// formatID is the CSI ID of the store object id of class on the node
// tagged tag ("" stays "").
func formatID(id, class, tag string) string {
	switch {
	case id == "":
		return ""
	case class == "" || class == devclass.Default:
		return id + "-" + tag
	}
	return id + "." + class + "." + tag
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
	storeID, _, tag = parseID(id)
	return storeID, tag
}

// parseID splits a CSI ID into the store's ID, the device class (the
// default's for an ID without one) and the node tag.
func parseID(id string) (storeID, class, tag string) {
	if len(id) <= storeIDLen+1 || !blockdev.ValidID(id[:storeIDLen]) {
		return id, devclass.Default, ""
	}
	switch rest := id[storeIDLen+1:]; id[storeIDLen] {
	case '-':
		return id[:storeIDLen], devclass.Default, rest
	case '.':
		class, tag, ok := strings.Cut(rest, ".")
		if ok && tag != "" && devclass.CheckName(class) == nil {
			return id[:storeIDLen], class, tag
		}
	}
	return id, devclass.Default, ""
}

// localID maps a CSI ID to this node's store ID. An ID tagged with another
// node gives a status with code and a message that names that node (or its
// tag) and how to reach it: what the caller should do differs per RPC. An
// ID of this node's of a device class it cannot serve gives
// FailedPrecondition (classAvailable).
func (d *Driver) localID(id, kind string, code codes.Code) (string, error) {
	storeID, tag := splitID(id)
	if tag != "" && tag != d.tag {
		return "", status.Errorf(code, "%s %s lives on %s, not on node %s: node-local %ss are only served by the plugin on their own node",
			kind, id, tagNode(tag), d.cfg.NodeID, kind)
	}
	if err := d.classAvailable(kind, id); err != nil {
		return "", err
	}
	return storeID, nil
}

// classAvailable refuses, with FailedPrecondition, a CSI ID of this node's
// (or untagged) of a device class this node does not serve: its objects
// are not found here, but that does not make them gone (a DeleteVolume
// must not succeed for them), and the message says what is wrong with the
// class. Another node's IDs are that node's to judge.
func (d *Driver) classAvailable(kind, id string) error {
	_, class, tag := parseID(id)
	if tag != "" && tag != d.tag {
		return nil
	}
	if _, err := d.store.get(class); err != nil {
		return status.Errorf(codes.FailedPrecondition, "%s %s: %s", kind, id, status.Convert(err).Message())
	}
	return nil
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

// nodeVolumeID is the store's ID of a volume in a node RPC. Kubelet only
// asks the plugin of the node a volume's PV is pinned to, so the tag is not
// checked (NodeUnpublishVolume must also work for a volume the store no
// longer knows); the class is (classAvailable).
func (d *Driver) nodeVolumeID(id string) (string, error) {
	if id == "" {
		return "", invalid("volume ID is missing")
	}
	if err := d.classAvailable("volume", id); err != nil {
		return "", err
	}
	storeID, _ := splitID(id)
	return storeID, nil
}
