#!/bin/sh
# timeout: 600
# 41-ublk-backend: the blockdev backend conformance suite on the ublk backend,
# the store's deletion of a volume whose ublk device was left behind, and a
# rate-limit change forwarded over the peer channel reaching a live ublk
# device (issue 33).
. /opt/fastblk/vm/lib.sh
gotest pkg/blockdev/backend -test.run 'TestUblkBackend' || exit 1
gotest pkg/blockdev/store -test.run 'TestUblkBackend' || exit 1
gotest pkg/driver -test.run '^TestForwardedModifyReachesUblkDevice$' || exit 1
# Alone in the VM: a mount namespace child copies no other test's mounts.
FASTBLK_EXCLUSIVE_MOUNTS=1 gotest pkg/blockdev/mountinfo -test.run '^TestMountDiesWithProcess$' || exit 1
