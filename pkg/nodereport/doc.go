// Package nodereport tells the cluster, through the API server, what one
// node's plugin serves, where users and operators look with kubectl:
//   - the node's backend: the Node's label <driver>/backend (ublk or loop),
//     its annotation <driver>/backend-reason with why a node that was to
//     serve ublk serves loop, and a Warning event on the Node saying so;
//   - why the node gives a StorageClass no capacity (a class with rate
//     limits on a loop node, a device class it lacks or cannot serve): a
//     Warning event on the StorageClass and on each of its pending claims,
//     since the scheduler only says that no node had enough free storage.
//
// The plugin's node service account may patch only its own Node, and only
// these two keys (the chart's ValidatingAdmissionPolicy). A Reporter is
// safe for concurrent use; what it sends goes in the background and is
// retried, never in the caller's way.
package nodereport
