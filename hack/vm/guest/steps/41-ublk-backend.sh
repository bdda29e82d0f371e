#!/bin/sh
# timeout: 600
# 41-ublk-backend: the blockdev backend conformance suite on the ublk backend,
# and the store's deletion of a volume whose ublk device was left behind.
. /opt/fastblk/vm/lib.sh
gotest pkg/blockdev/backend -test.run 'TestUblkBackend' || exit 1
gotest pkg/blockdev/store -test.run 'TestUblkBackend' || exit 1
# Alone in the VM: a mount namespace child copies no other test's mounts.
FASTBLK_EXCLUSIVE_MOUNTS=1 gotest pkg/blockdev/mountinfo -test.run '^TestMountDiesWithProcess$' || exit 1
