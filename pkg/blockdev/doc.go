// Package blockdev owns csi-fastblk's volumes and the devices that expose them.
//
// A volume is a sparse file under the data directory plus a small metadata
// record; a snapshot is a frozen copy of a volume's file (a reflink where the
// filesystem can share extents, a sparse-aware copy otherwise). The Store keeps
// both, crash-safely, and answers capacity questions. A Backend turns a volume
// file into a block device (the kernel loop device, or a ublk device served by
// this process) and finds the devices it made again after a restart.
//
// Names become IDs, never paths: VolumeID and SnapshotID hash a name of up to
// MaxNameLen bytes into a fixed alphabet, and ValidID guards every ID that
// arrives from outside. Sizes are whole SizeAlign (4 KiB) blocks; the Store
// rounds requests up and reports the rounded size.
//
// blockdev knows nothing of CSI or gRPC: it returns errors that wrap the
// sentinels in errors.go, and the driver maps those to status codes. Store and
// the backends are safe for concurrent use; callers serialise operations on the
// same volume (the driver holds a lock per volume ID), and the Store also
// serialises operations on one ID itself. The Store holds no open files
// between calls; backends own the devices they make.
package blockdev
