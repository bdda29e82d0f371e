#!/bin/sh
# timeout: 600
# 46-ublk-cbt: changed-block tracking on the ublk data path (issues 42 and
# 51): known ranges written through a raw block volume's device between
# snapshots come back as the delta, from the data path's records while the
# plugin runs and across a clean unstage and restage, and by comparing the
# snapshot files after a restart whose re-adopted device lost its record
# (a write made before the restart included); the server's own record of
# writes, discards and zero-outs per cut (with the device's I/O held),
# across a detach and a clean and an unclean restart; a restart onto ublk
# with a volume in use on a loop device (kept there, no second device); a
# mounted volume's snapshot holding the device's I/O while a writer with
# the device open has a write in flight; and the differential test of
# GetMetadataDelta against the snapshots' bytes through rollouts, crashes,
# backend changes, a failed snapshot and a stop during a snapshot (about
# a minute in all). The marking itself is tested on the host
# (pkg/blockdev/cbt, the dataplane's TestQueueRecordsChanges).
. /opt/fastblk/vm/lib.sh
[ -e /dev/ublk-control ] || { echo "no /dev/ublk-control: ublk_drv not loaded"; exit 1; }
gotest pkg/blockdev/ublk -test.run '^TestServerRecordsChanges$' || exit 1
gotest pkg/driver -test.run '^(TestUblkDeltaMatchesWrites|TestRestartOnAnotherBackendKeepsTheDeviceInUse|TestMountedSnapshotHoldsDeviceIO|TestDeltaNeverMissesAChange)$' || exit 1
left=$(ublk_devices | grep -v ublk-control)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
