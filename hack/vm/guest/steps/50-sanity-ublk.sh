#!/bin/sh
# timeout: 1500
# 50-sanity-ublk: the whole csi-sanity suite (mount and block access) against
# the real driver with the ublk backend on this kernel.
. /opt/fastblk/vm/lib.sh
FASTBLK_TEST_BACKEND=ublk gotest test/sanity
