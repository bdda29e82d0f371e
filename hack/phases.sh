#!/usr/bin/env bash
# phases.sh TARGET...: make test's runner. Runs each make target in turn
# (the targets of A+B at once), stops at the first that fails, and prints
# the time and CPU seconds each took, last: CI keeps only the end of the
# output, so the table is what says where the time went, and which phase
# failed.
#
# CPU seconds come from a cgroup v1 cpuacct group per phase (cpu.sh), which
# counts every process the phase starts, daemons too, but not the pods and
# node processes the test cluster moves into cgroups of its own; without
# cpuacct, from bash's times (the processes the phase waited for). On a
# 2-core machine with no cache, the sum of the CPU column over two (with
# the prebuild's line, printed after this table) is about the wall time.
set -uo pipefail
# shellcheck source=hack/cpu.sh
. "$(dirname "${BASH_SOURCE[0]}")/cpu.sh"
MAKE=${MAKE:-make}
logdir=${PHASES_LOGDIR:-bin/phases}
rows=() rc=0 start=$SECONDS cpu_all=0

# row TARGET SECONDS CPU RC adds TARGET's line to the table.
row() {
	rows+=("$(printf '%-12s %5d s %6d cpu-s  %s' "$1" "$2" "$3" "$( (($4 == 0)) && echo ok || echo "FAILED (exit $4)")")")
	cpu_all=$((cpu_all + $3))
}

# group A+B...: runs the targets at once, all but the last in the
# background with their output in $logdir/TARGET.log, which prints after
# the last ends (a failed one's last of all, where CI keeps it).
group() {
	local targets t t0=$SECONDS last rc_last r secs cpu
	IFS=+ read -ra targets <<<"$1"
	last=${targets[-1]}
	mkdir -p "$logdir"
	for t in "${targets[@]:0:${#targets[@]}-1}"; do
		rm -f "$logdir/$t.status"
		(
			r=0
			cpu_run "phase-$t" $MAKE --no-print-directory "$t" >"$logdir/$t.log" 2>&1 || r=$?
			echo "$r $((SECONDS - t0)) $CPU_SECONDS" >"$logdir/$t.status"
		) &
		echo "== $t runs beside $last (its output: $logdir/$t.log, printed when both end)"
	done
	rc_last=0
	cpu_run "phase-$last" $MAKE --no-print-directory "$last" || rc_last=$?
	row "$last" $((SECONDS - t0)) "$CPU_SECONDS" "$rc_last"
	wait
	local failed=()
	for t in "${targets[@]:0:${#targets[@]}-1}"; do
		read -r r secs cpu <"$logdir/$t.status" 2>/dev/null || { r=1 secs=$((SECONDS - t0)) cpu=0; }
		row "$t" "$secs" "$cpu" "$r"
		if ((r == 0)); then
			echo "== output of $t (ran beside $last)"
			cat "$logdir/$t.log"
		else
			failed+=("$t")
			rc=$r
		fi
	done
	for t in "${failed[@]}"; do
		echo "== output of $t (ran beside $last): FAILED"
		cat "$logdir/$t.log"
	done
	((rc_last == 0)) || rc=$rc_last
}

for target in "$@"; do
	if [[ $target == *+* ]]; then
		group "$target"
	else
		t0=$SECONDS
		cpu_run "phase-$target" $MAKE --no-print-directory "$target"
		rc=$?
		row "$target" $((SECONDS - t0)) "$CPU_SECONDS" "$rc"
	fi
	((rc == 0)) || break
done
echo
echo "make test: $((SECONDS - start)) s, $cpu_all CPU s in all"
printf '  %s\n' "${rows[@]}"
exit "$rc"
