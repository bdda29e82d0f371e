#!/bin/sh
# run-steps.sh runs the guest step scripts steps/NN-name.sh in order, each in
# its own session with a time limit (a "# timeout: SECONDS" line in the step,
# default 600), printing "STEP name PASS|FAIL (seconds)" per step and
# "N passed, N failed" at the end. Exits non-zero if any step failed.
#
# Usage: run-steps.sh [PATTERN...]   run only steps whose name matches a glob
#                                    PATTERN, e.g. '10-*' or '*uring*'
dir=$(cd "$(dirname "$0")" && pwd)/steps

now() { awk '{print $1}' /proc/uptime; }

selected() {
	[ $# -gt 1 ] || return 0
	_name=$1
	shift
	for _p in "$@"; do
		# shellcheck disable=SC2254
		case "$_name" in $_p) return 0 ;; esac
	done
	return 1
}

pass=0
fail=0
failed=""
for step in "$dir"/[0-9][0-9]-*.sh; do
	[ -f "$step" ] || continue
	name=$(basename "$step" .sh)
	selected "$name" "$@" || continue
	limit=$(sed -n 's/^# timeout: *\([0-9][0-9]*\).*/\1/p' "$step" | head -n1)
	limit=${limit:-600}
	echo "=== STEP $name (limit ${limit}s)"
	t0=$(now)
	setsid sh "$step" &
	pid=$!
	(sleep "$limit" && echo "STEP $name: time limit ${limit}s reached, killing" &&
		kill -KILL -- "-$pid") &
	watchdog=$!
	wait "$pid"
	rc=$?
	kill "$watchdog" 2>/dev/null
	kill -KILL -- "-$pid" 2>/dev/null
	secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
	if [ "$rc" -eq 0 ]; then
		pass=$((pass + 1))
		echo "STEP $name PASS (${secs}s)"
	else
		fail=$((fail + 1))
		failed="$failed $name"
		echo "STEP $name FAIL (${secs}s, exit $rc)"
	fi
done
echo "STEPS: $pass passed, $fail failed${failed:+ (failed:$failed)}"
[ "$pass" -gt 0 ] && [ "$fail" -eq 0 ]
