#!/bin/sh
# timeout: 1500
# 44-plugin-ublk: the plugin binary's own tests (test/plugin) on the ublk
# backend: the backing file failing under a published volume (the data
# directory full: ENOSPC, also for overwrites of blocks a snapshot shares on
# xfs with reflink; shut down: EIO; preallocated volumes keep writing on a
# full disk), and 200 full lifecycles with
# every failing step once, counting the plugin's fds, goroutines, threads,
# mappings and RSS and the node's mounts, ublk devices and files before
# and after (TestLifecycleLeaks).
. /opt/fastblk/vm/lib.sh
export FASTBLK_TEST_BACKEND=ublk FASTBLK_BIN=${FASTBLK_BIN:-/usr/bin/csi-fastblk}
export FASTBLK_LEAK_CYCLES=${FASTBLK_LEAK_CYCLES:-200}
gotest test/plugin -test.run '^(TestFullDisk|TestFullDiskAfterSnapshot|TestFullDiskPreallocated|TestBackingEIO|TestServeMetricsAndStatus|TestLifecycleLeaks)$' || exit 1
left=$(ublk_devices | grep -v ublk-control)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
