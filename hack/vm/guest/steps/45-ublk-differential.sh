#!/bin/sh
# timeout: 600
# 45-ublk-differential: the kernel's loop device as the oracle for every
# request (issue 43): the seeded differential test on 1 MiB, 3 GiB and
# 17 GiB volumes, thin and preallocated, at depth 1 and 32
# (TestServerAnswersAsLoopDoes, about a minute), then again while server
# threads fail at random moments in four windows of their loop, 52 times
# (TestServerAnswersAsLoopDoesThroughThreadDeaths, which prints the heal
# times and where the failures landed), and the harness against itself.
# The soak runs the same with new seeds for as long as asked
# (hack/vm/soak.sh).
. /opt/fastblk/vm/lib.sh
[ -e /dev/ublk-control ] || { echo "no /dev/ublk-control: ublk_drv not loaded"; exit 1; }
gotest pkg/blockdev/ublk -test.run '^(TestServerAnswersAsLoopDoes|TestServerAnswersAsLoopDoesThroughThreadDeaths|TestDifferentialHarnessAgreesWithItself)$' ${DIFF_ARGS:-} || exit 1
left=$(ublk_devices | grep -v ublk-control)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
