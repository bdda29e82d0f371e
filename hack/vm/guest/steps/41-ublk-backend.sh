#!/bin/sh
# timeout: 600
# 41-ublk-backend: the blockdev backend conformance suite on the ublk backend.
. /opt/fastblk/vm/lib.sh
gotest pkg/blockdev -test.run 'TestUblkBackend'
