#!/bin/sh
# timeout: 900
# 10-uring-tests: the io_uring engine's tests on this kernel.
. /opt/fastblk/vm/lib.sh
gotest pkg/blockdev/uring
