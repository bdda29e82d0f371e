// Package snapshotowner gives the VolumeSnapshotContents made by hand for
// this node's snapshots (pre-provisioned: source.snapshotHandle) the label
// snapshot.storage.kubernetes.io/managed-by with this node's name. In
// distributed snapshotting each node's csi-snapshotter handles only the
// contents labelled with its node, and the snapshot-controller labels only
// the contents it creates, so without the label no sidecar reads a
// hand-made content and its VolumeSnapshot never becomes ready.
//
// Each node's plugin labels the contents whose handle is its own, so the
// label always names the node that holds the snapshot.
package snapshotowner
