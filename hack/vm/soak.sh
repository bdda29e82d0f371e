#!/usr/bin/env bash
# soak.sh runs the differential test (issue 43; guest step 45) in the VM for
# as long as asked, a new seed each round, while server threads fail at
# random moments: each round runs the seeded matrix of volumes against the
# kernel's loop device and then the thread-death run, and prints the seed,
# the requests compared, the failures injected and the heal times. A
# failure prints its seed; -diff.seed=SEED replays it (SOAK_SEED).
#
# Usage: hack/vm/soak.sh [--kernel 6.12|7.3] [--minutes N]
#   --kernel K    the kernel to boot (default 7.3)
#   --minutes N   how long the differential rounds run (default 30)
# Environment: SOAK_SEED replays one seed; E2E_VM_SKIP_BUILD=1 reuses the
#   last images; logs go to bin/vm/soak-<kernel>.log.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"
kernel=7.3 minutes=30
while (($#)); do
	case "$1" in
	--kernel) kernel=${2:?}; shift 2 ;;
	--minutes) minutes=${2:?}; shift 2 ;;
	*) sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
kernel_dir "$kernel" >/dev/null
if [[ ${E2E_VM_SKIP_BUILD:-0} != 1 ]]; then
	"$VM_DIR/kernels.sh"
	"$VM_DIR/initramfs.sh"
fi
args="-diff.soak=${minutes}m"
[[ -n ${SOAK_SEED:-} ]] && args="-diff.seed=$SOAK_SEED"
mkdir -p "$REPO_ROOT/bin/vm"
exec "$VM_DIR/run.sh" --kernel "$kernel" --timeout $((minutes * 60 + 900)) --log "$REPO_ROOT/bin/vm/soak-$kernel.log" -- \
	". /opt/fastblk/vm/lib.sh && gotest pkg/blockdev/ublk -test.run '^(TestServerAnswersAsLoopDoes|TestServerAnswersAsLoopDoesThroughThreadDeaths)\$' $args -test.timeout=$((minutes + 14))m"
