#!/bin/sh
# timeout: 1500
# 40-ublk-e2e: the real csi-fastblk binary with --backend ublk, driven over
# CSI: fio verify (raw and ext4), kill -9 recovery, the I/O stall of a
# SIGTERM restart (an upgrade: TestUpgradeStall logs median and worst),
# the metric families only ublk serves, discard, expansion, the change
# records across a rollout (the first delta after it from the records, on a
# 10 GiB volume) and a crash, a device that cannot be re-adopted failing
# its writer's I/O after the bound, teardown leaving no ublk devices
# (test/e2e).
. /opt/fastblk/vm/lib.sh
export FASTBLK_BIN=${FASTBLK_BIN:-/usr/bin/csi-fastblk}
gotest test/e2e
