#!/usr/bin/env bash
# copy.sh (make bench-copy; a section of make bench) measures what a
# restore and a clone copying in the background cost a volume in use on the
# same node: pkg/driver's TestCopyCostFigures, fio (4k random reads, then
# writes, queue depth 32) on a volume of one test node, its IOPS just before
# each copy (idle) and while that node, or a second one joined by the peer
# channel on 127.0.0.1, copies 1 GiB half written from it, once per design
# of the copy, the designs interleaved. It runs on this machine with the
# loop backend, then in the VM on each kernel with the ublk backend, and
# prints each run's table: medians, each run's ratio beside them, all
# ratios to the same run's idle IOPS. A benchmark, not a test: it fails
# only when a run fails.
#
# Designs (COPY_DESIGNS): rate (the copy bounded by its bytes per second
# alone), paced (the plugin's Governor, pkg/blockdev/copypace, by what the
# copy costs the volume), idle (every thread of the plugins in SCHED_IDLE
# and the idle I/O class: an experiment, on the loop backend only, where the
# plugins' threads do nothing but the copy), nice (nice 19, the same).
#
# Environment: BENCH_REPS (default 3), COPY_DESIGNS (default "rate paced
#   idle" on this machine, "rate paced" in the VM), COPY_SIZE (bytes, default
#   1 GiB on this machine and 256 MiB in the VM), COPY_ONLY (a regexp on
#   "<copy>/<fio>/<design>"), COPY_WHERE (default "host vm": this machine,
#   the VM), COPY_KERNELS (default: every VM kernel), BENCH_VM_SKIP_BUILD=1
#   reuses the last VM images, BENCH_VM_LOGDIR (default bin/vm).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/vm/lib.sh
source hack/vm/lib.sh

reps=${BENCH_REPS:-3}
only=${COPY_ONLY:-}
logdir=${BENCH_VM_LOGDIR:-$REPO_ROOT/bin/vm}
mkdir -p bin/bench "$logdir"

# figures prints the test's table and header lines from its output.
figures() {
	tr -d '\r' | sed -n 's/^ *copycost_figures_test.go:[0-9]*: //p' | grep -E '^(\||backend |load average)' || true
}

test_env=(FASTBLK_COPY_FIGURES=1 "FASTBLK_COPY_REPS=$reps" "FASTBLK_COPY_ONLY=$only")
status=0

where=${COPY_WHERE:-host vm}
if [[ $where == *host* ]]; then
	echo "== this machine, loop backend, host kernel $(uname -r)"
	go test -c -o bin/bench/driver.test ./pkg/driver
	log=bin/bench/copy-host.log
	if (cd pkg/driver && env "${test_env[@]}" "FASTBLK_COPY_DESIGNS=${COPY_DESIGNS:-rate paced idle}" \
		"FASTBLK_COPY_SIZE=${COPY_SIZE:-1073741824}" ../../bin/bench/driver.test \
		-test.run '^TestCopyCostFigures$' -test.v -test.count=1 -test.timeout 60m) >"$log" 2>&1; then
		figures <"$log"
	else
		status=1
		echo "FAILED (log: $log)"
		tail -20 "$log"
	fi
fi

[[ $where == *vm* ]] || exit "$status"
if [[ ${BENCH_VM_SKIP_BUILD:-0} != 1 ]]; then
	"$VM_DIR/kernels.sh"
	"$VM_DIR/initramfs.sh"
fi
# The data directories on the VM's data disk (TMPDIR), not in its RAM.
guest="cd /opt/fastblk/pkg/driver && TMPDIR=/data FASTBLK_COPY_BACKEND=ublk ${test_env[*]} \
FASTBLK_COPY_DESIGNS='${COPY_DESIGNS:-rate paced}' FASTBLK_COPY_SIZE=${COPY_SIZE:-268435456} \
./driver.test -test.run '^TestCopyCostFigures\$' -test.v -test.count=1 -test.timeout 110m"
for k in ${COPY_KERNELS:-${VM_KERNELS[*]}}; do
	echo
	echo "== VM, kernel $k, ublk backend"
	log=$logdir/copy-$k.log
	if "$VM_DIR/run.sh" --kernel "$k" --disk-size 8G --timeout 7200 --quiet --log "$log" -- "$guest" >/dev/null 2>&1; then
		figures <"$log"
	else
		status=1
		echo "FAILED (log: $log)"
		tail -20 "$log"
	fi
done
exit "$status"
