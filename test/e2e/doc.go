// Package e2e holds the end-to-end tests of the ublk backend: they start
// the real csi-fastblk binary (FASTBLK_BIN, default /bin/csi-fastblk) with
// --backend ublk, drive it over CSI gRPC, and check data with fio, kill -9
// recovery, discard, online expansion and teardown. They need root and a
// kernel with ublk_drv, so they run in the VM (hack/vm/guest/steps/41-*)
// and skip elsewhere.
package e2e
