#!/bin/sh
# timeout: 600
# 30-ublk-queue: the ublk queue data plane on this kernel: per-queue rings in
# copy mode (and zero copy with AUTO_BUF_REG where the driver has it) against
# real /dev/ublkbN devices, plus the queue's pure and host-ring tests and
# the io-wq bound of a server thread, read back from this kernel.
. /opt/fastblk/vm/lib.sh
[ -e /dev/ublk-control ] || { echo "no /dev/ublk-control: ublk_drv not loaded"; exit 1; }
gotest pkg/blockdev/ublk -test.run '^(TestQueue|TestSharedThread|TestStalledBacking|TestThread|TestAblations|TestRequiredFeatures)' || exit 1
gotest pkg/blockdev/ublk/internal/dataplane -test.run '^(TestQueue|TestStartQueue|TestThread|TestIOWQ|TestDeviceThreadRunsWithItsIOWQBound|TestParseAblation|TestSpreadQueues|TestRangeAlloc|TestLoop|TestDecodeDesc|TestPlanFor|TestFullResult|TestUserData|TestLatencyBucket|TestStatsObserve|TestDescLayout)' || exit 1
# On the data disk's filesystem: a NOWAIT write over a stale mtime goes
# through once touchMtime has set the mtime (the premise of the queue's
# NowaitWrites path), and the queue's data path with NowaitWrites.
TMPDIR=$FASTBLK_DATA gotest pkg/blockdev/ublk/internal/dataplane \
	-test.run '^(TestTouchMtimeSetsMtimeAndLeavesAtime|TestNowaitWriteAfterTouchMtime|TestStaleMtimeRefusesNowaitReportsAMissingDir)$' || exit 1
TMPDIR=$FASTBLK_DATA gotest pkg/blockdev/ublk -test.run '^TestQueueDataPath$/nowait' || exit 1
# The tests must leave no ublk device behind.
left=$(ublk_devices)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
