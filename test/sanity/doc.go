// Package sanity runs the csi-sanity suite (csi-test's Go package) against
// the real csi-fastblk driver: real backend devices, real mkfs and mounts.
// It needs root; set FASTBLK_TEST_BACKEND=ublk to run it on the ublk backend
// (inside the VM), default loop.
package sanity
