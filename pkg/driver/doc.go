// Package driver implements the CSI Identity, Controller and Node services of
// csi-fastblk over a store.Store and a blockdev.Backend.
//
// It owns request validation, idempotency, the mapping of blockdev errors to
// gRPC codes, and per-volume serialisation; it issues no syscalls of its own:
// volumes and devices go through pkg/blockdev, mounts through k8s.io/mount-utils.
// A Driver is safe for concurrent use: calls on different volumes run in
// parallel, calls on the same volume (or snapshot) are serialised.
package driver
