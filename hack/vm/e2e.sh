#!/usr/bin/env bash
# e2e.sh runs the real-kernel ublk tests (make e2e-vm): it fetches the kernels,
# builds the initramfs and tools image, then boots Debian's 6.12 and 7.3 kernels
# in turn and runs every guest step (hack/vm/guest/steps) in each, printing a
# per-kernel summary, then the power-cut test (powercut.sh: two more boots
# on one data disk). It fails if any step fails on either kernel.
#
# Usage: hack/vm/e2e.sh [--kernel 6.12|7.3] [STEP-PATTERN...]
#   --kernel K      run on one kernel only (default: both)
#   STEP-PATTERN    run only the steps whose name matches a glob, e.g. '1*';
#                   the power-cut test runs when no pattern is given or one
#                   matches "powercut"
# Environment: E2E_VM_TIMEOUT (seconds per kernel, default 2400: 6.12 took
#   1086 s beside make test's background build, 800-830 s alone),
#   E2E_VM_LOGDIR (default bin/vm), E2E_VM_SKIP_BUILD=1 reuses the last images.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

kernels=("${VM_KERNELS[@]}")
if [[ ${1:-} == --kernel ]]; then
	kernel_dir "${2:?--kernel needs 6.12 or 7.3}" >/dev/null
	kernels=("$2")
	shift 2
fi
logdir=${E2E_VM_LOGDIR:-$REPO_ROOT/bin/vm}
mkdir -p "$logdir"
start=$(date +%s)

if [[ ${E2E_VM_SKIP_BUILD:-0} != 1 ]]; then
	"$VM_DIR/kernels.sh"
	"$VM_DIR/initramfs.sh"
fi

# powercut_selected: the power-cut test runs with every step, or when a
# pattern matches its name.
powercut_selected() {
	(($# == 0)) && return 0
	local p
	for p in "$@"; do
		# shellcheck disable=SC2053
		[[ powercut == $p ]] && return 0
	done
	return 1
}

# failure_digest LOG prints, for each step that failed in LOG, its failed
# tests, each after the messages it logged (a test's own lines since its
# === RUN), and panics and the time limit, at most 40 lines a step: CI keeps
# only the end of the output, and this is what tells a flake from a
# regression.
failure_digest() {
	awk '
	function keep(line) { if (n < 40) buf[n++] = line }
	/^=== STEP / {n = 0; m = 0; next}
	/^=== (RUN|CONT) / {m = 0; next}
	/^ +[A-Za-z0-9_]+\.go:[0-9]+: / {if (m < 20) cur[m++] = $0; next}
	/^ *--- FAIL/ {for (i = 0; i < m; i++) keep(cur[i]); m = 0; keep($0); next}
	/^panic: |time limit .* reached/ {keep($0); next}
	/^STEP .* FAIL \(/ {
		print "   -- why " $2 " failed:"
		for (i = 0; i < n; i++) print "      " buf[i]
		if (n == 0) print "      (no failed test or panic in the log; see the log)"
	}
	' "$1"
}

declare -A status=() took=() pcstatus=() pctook=()
for k in "${kernels[@]}"; do
	t0=$(date +%s)
	set +e
	"$VM_DIR/run.sh" --kernel "$k" --timeout "${E2E_VM_TIMEOUT:-2400}" \
		--log "$logdir/e2e-$k.log" -- /opt/fastblk/vm/run-steps.sh "$@"
	status[$k]=$?
	set -e
	took[$k]=$(($(date +%s) - t0))
	if powercut_selected "$@"; then
		t0=$(date +%s)
		set +e
		"$VM_DIR/powercut.sh" --kernel "$k" --log-dir "$logdir"
		pcstatus[$k]=$?
		set -e
		pctook[$k]=$(($(date +%s) - t0))
	fi
done

failed=0
echo
echo "==== e2e-vm summary ($(($(date +%s) - start))s in all) ===="
for k in "${kernels[@]}"; do
	log="$logdir/e2e-$k.log"
	release=$(cat "$(kernel_dir "$k")/release")
	if ((status[$k] == 0)); then verdict=PASS; else verdict="FAIL (exit ${status[$k]})"; failed=1; fi
	boot=$(grep -a -o -m1 'vm: ready after [0-9.]*s' "$log" | grep -o '[0-9.]*s$' || echo '?')
	echo "-- kernel $release: $verdict in ${took[$k]}s, booted in $boot (log $log)"
	grep -a -E '^(STEP .* (PASS|FAIL) \(|STEPS: )' "$log" | sed 's/^/   /' || echo "   no step ran"
	failure_digest "$log"
	if [[ -n ${pcstatus[$k]:-} ]]; then
		if ((pcstatus[$k] == 0)); then verdict=PASS; else verdict="FAIL (exit ${pcstatus[$k]})"; failed=1; fi
		echo "   POWERCUT $verdict (${pctook[$k]}s, two boots; logs $logdir/powercut-$k-{1,2}.log)"
	fi
done
exit "$failed"
