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
//
// Group snapshots need the same and more (group.go): the snapshot-controller
// labels neither the VolumeGroupSnapshotContents nor the contents of
// their members, and a csi-snapshotter in --node-deployment mode reads
// VolumeGroupSnapshotClasses through the same label selector as the
// contents (external-snapshotter v8.6.0), so it sees a class only while
// the class is labelled with its node. The plugins therefore label a
// group's content, and its members' contents, with the node that holds
// them, and hand each class from node to node: a node that has a group to
// make labels the class with itself when the node it names has finished
// its own.
package snapshotowner
