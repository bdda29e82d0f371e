#!/bin/sh
# timeout: 300
# 48-ublk-group: group snapshots on ublk (issue 51): two raw block volumes
# served by ublk are held at one instant (each device's I/O held) for a
# group snapshot, and every member's delta to the next group's member and
# to a later plain snapshot comes from the data path's records and covers
# exactly the chunks written to that volume. The group's steps, its crash
# safety and its one instant on mounted volumes are tested on the host
# (pkg/blockdev/store TestGroupSnapshot*, TestCrashWhileGroupFrozen).
. /opt/fastblk/vm/lib.sh
[ -e /dev/ublk-control ] || { echo "no /dev/ublk-control: ublk_drv not loaded"; exit 1; }
gotest pkg/driver -test.run '^TestUblkGroupDeltasPerMember$' || exit 1
left=$(ublk_devices | grep -v ublk-control)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
