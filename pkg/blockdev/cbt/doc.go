// Package cbt is csi-fastblk's changed-block tracking: which byte ranges of
// a volume were written since its last snapshot, and what a snapshot file
// holds.
//
//   - Bitmap (bitmap.go) records the ranges one ublk queue's WRITE, DISCARD
//     and WRITE_ZEROES requests touch, at Granularity; its queue's server
//     thread marks it per request without a lock or allocation, and the
//     control side cuts it (reads and clears it) while the device's I/O is
//     held for a snapshot.
//   - Tracker (tracker.go) is one device's record: a Bitmap per queue, what
//     earlier devices of the volume recorded, and whether that record is
//     complete (trusted).
//   - Extent (extent.go): sorted, merged byte ranges, the currency of the
//     rest.
//   - Allocated and Compare (file_linux.go) read a snapshot file's extent
//     map (SEEK_DATA/SEEK_HOLE, never its data) and compare two files
//     exactly, the answer when no trusted record covers a delta.
//
// It knows neither devices nor volumes: package ublk's data plane marks the
// bitmaps, the store persists the records with each snapshot, the driver
// serves them. It imports nothing of ours. Bitmap and Tracker are safe for
// concurrent use as documented on each method; the functions hold no open
// files between calls.
package cbt
