// Package devclass checks and remembers a node's device classes. A device
// class is a data directory of its own (a disk, or a kind of disk) with its
// own reserve and over-provisioning ratio, which a StorageClass chooses by
// name; the driver keeps one store per class. The default class is the
// plugin's data directory (--data-dir), which needs no name and holds every
// volume made before classes existed; every other class is named and lives
// at its own path.
//
// It owns what can be wrong with a class before a store opens it, so that
// the driver can refuse that one class, clearly, and serve the others:
//   - a name that is not a class name (CheckName);
//   - a path that is missing, not a directory, or overlapping the default
//     class's or another class's directory (Check);
//   - a path on the node's root filesystem (the one of / or of the
//     kubelet's directory) without a reserve, where volumes would fill the
//     disk the kubelet, images and logs need (Check);
//   - a directory whose volumes belong to another class: each class
//     directory carries a marker naming its class (Claim).
//
// It also remembers, in the default class's directory, the classes the
// node has served and where (Seen, Remember), so that a class removed from
// the configuration while volumes still use it is reported with its
// volumes (Volumes) rather than forgotten.
//
// Nothing here is on a data path; the functions are safe for concurrent use
// on different directories.
package devclass
