// Package blockdev is the contract between csi-fastblk's driver and the
// code that keeps volumes and exposes them as block devices: the records
// (Volume, Snapshot, NodeState), the Backend interface and its optional
// capabilities (IOHolder, LimitSetter, IOStatser, Quarantiner), the error
// classes every layer below wraps (errors.go), how names become IDs
// (ids.go) and the parts of the data directory's layout the Store and the
// backends share (layout.go). It does no I/O; every package below imports
// it and it imports none of them.
//
// # Packages
//
// Imports run down this list, never up:
//
//	store       volumes and snapshots under the data directory: records,
//	            capacity, the directory's lock; crash-safe (owner, filecopy)
//	devclass    the node's device classes: the checks of a class's
//	            directory before its store opens it, and the classes served
//	backend     Backend selection and the ublk and loop adapters
//	            (backendtest: the conformance suite both run)
//	quiesce     holding a volume in use steady for a copy: the policy,
//	            filesystem freeze with records that survive a crash, flush
//	owner       the data directory's owner token, carried by its devices
//	filecopy    reflink, sparse-aware copy and resync of volume files
//	copypace    pacing of background copies by what they cost the
//	            volumes in use (blkdev)
//	cbt         changed-block tracking: the bitmaps the ublk data path
//	            marks, a snapshot file's extent map, the exact comparison
//	ublk, loop  the devices themselves; uring the io_uring engine (ublk's
//	            data plane and UAPI: ublk/internal/dataplane, internal/uapi)
//	filelock    the plugin's lock on its CSI socket's path
//	mountinfo, cgroup, blkdev, fsstat, kernel
//	            facts about the node: the mount table, the pids limit,
//	            block devices (numbers, size, disk counters), filesystem
//	            usage and errors, the kernel release
//
// # The life of a 4k write
//
// A pod writes to a file on a volume staged with the ublk backend: the
// filesystem sends a 4 KiB WRITE to /dev/ublkbN, the device
// backend/ublk.go attached through ublk.Server when the volume was staged
// (its link /dev/fastblk/<volume-id> is what the driver mounted). ublk_drv
// completes the request's fetch command on the io_uring of the server thread
// serving that device's queue; the thread reads the request's descriptor,
// issues one WRITE on the volume file, <data dir>/volumes/<id>.img (opened
// with O_DIRECT, registered with the ring), and on its completion commits
// the result and fetches the tag's next request in one command, batched into
// the same io_uring_enter as every other device that thread serves (the
// data plane, ublk/internal/dataplane; its doc names the files). Nothing in this package, the store or the
// driver is on that path. With the loop backend (backend/loop.go) the
// kernel's loop driver does the same with direct I/O on the same file.
//
// # The life of a snapshot
//
// The driver's CreateSnapshot (pkg/driver/snapshots.go) locks the source
// volume and asks quiesce.For (quiesce/policy.go) how to hold it steady
// while it is copied: nothing when it is not staged; a frozen filesystem when it is mounted
// (quiesce.FreezeVolume, which records the freeze in <data dir>/frozen
// first, so that a plugin killed while it is frozen thaws it on its next
// start, quiesce.ThawAbandoned); the backend's IOHolder for a raw block
// volume on ublk (backend/ublk.go HoldIO); a device flush
// (quiesce.FlushDevice) and one reflink on loop. store.CreateSnapshot
// (store/snapshot.go) then copies the volume file while it is live
// (filecopy.CopyFile: a reflink, or a sparse-aware copy), holds the source
// only while the copy catches up (filecopy.ResyncFile), releases it, syncs
// the copy, and makes the snapshot exist by writing its record atomically
// (store/record.go, <data dir>/meta/<id>.json). A crash at any point
// leaves either no snapshot or a complete one: Open removes files without
// records.
//
// # Concurrency
//
// Store and the backends are safe for concurrent use; callers serialise
// operations on the same volume (the driver holds a lock per volume ID), and
// the Store also serialises operations on one ID itself.
package blockdev
