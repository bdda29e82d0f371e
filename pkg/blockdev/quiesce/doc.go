// Package quiesce holds a volume in use steady while its file is copied,
// by the means the volume allows (freeze_linux.go, flush_linux.go):
//
//   - a mounted filesystem is frozen (FreezeFS, FIFREEZE); FreezeVolume
//     first records the freeze under <data dir>/frozen, because a frozen
//     filesystem outlives the process that froze it, and ThawAbandoned
//     thaws what a killed plugin left frozen;
//   - a device whose backend can hold its I/O (blockdev.IOHolder, the
//     ublk backend) is held by the backend itself, after the freeze when
//     a filesystem is mounted on it (a freeze does not stop a writer with
//     the device open);
//   - any other device is flushed (FlushDevice): its completed writes reach
//     the file, but new ones keep flowing, so only a single reflink copies
//     it consistently.
//
// For is the policy that chooses among them (policy.go); the driver calls
// it and logs the hold, the store runs it around its copy (store.Hold).
package quiesce
