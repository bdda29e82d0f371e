#!/bin/sh
# timeout: 600
# 42-ublk-control: the ublk control plane on this kernel: features, device
# create/IO/resize/detach, kill-free re-adoption (user recovery), the orphan
# sweep and ownership, a failed server thread healed in the process with fio
# verify running on three devices (TestServerHealsFailedThread, about 20 s)
# and its failure failing health, plus the pure control tests (UAPI layout,
# encoding, flags, tuning, state files).
. /opt/fastblk/vm/lib.sh
[ -e /dev/ublk-control ] || { echo "no /dev/ublk-control: ublk_drv not loaded"; exit 1; }
gotest pkg/blockdev/ublk -test.run '^(TestControl|TestServer|TestRecoveryWaitsForQuiesced|TestChooseTuning|TestAddFlags|TestFlagNames|TestParseMode|TestCPUsOf|TestPutCtrlCmd|TestDeviceParams|TestStateRoundTrip|TestValidName|TestOwnerToken)' -test.skip '^TestServerAnswersAsLoopDoes' || exit 1
gotest pkg/blockdev/ublk/internal/uapi -test.run '^(TestUAPILayout|TestCommandEncoding)$' || exit 1
left=$(ublk_devices | grep -v ublk-control)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
