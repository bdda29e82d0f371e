#!/bin/sh
# timeout: 900
# 43-ublk-race: the ublk server's concurrency under the race detector, against
# real devices: shared server threads serving many devices, devices joining
# and leaving, pause, a failed server thread's in-process heal and its
# failure, and the server's attach/detach/close (the race build of
# pkg/blockdev/ublk; the other steps run CGO_ENABLED=0 builds, which the race
# detector cannot instrument).
. /opt/fastblk/vm/lib.sh
bin=$FASTBLK_ROOT/pkg/blockdev/ublk/ublk.race.test
[ -x "$bin" ] || { echo "$bin missing: hack/vm/initramfs.sh builds it"; exit 1; }
cd "$FASTBLK_ROOT/pkg/blockdev/ublk" &&
	GORACE=halt_on_error=1 "$bin" -test.v -test.count=1 -test.timeout=14m \
		-test.run '^(TestSharedThreadServesManyDevices|TestSharedThreadIsFair|TestThreadFailureSurfaces|TestServerLifecycle|TestServerPauseHoldsWrites|TestServerHealthFailsWhenThreadNotHealed|TestServerHealsFailedThreadUnderPause|TestServerControlNotBlockedByStuckCommand)$' || exit 1
left=$(ublk_devices)
[ -z "$left" ] || { echo "ublk devices left behind: $left"; exit 1; }
