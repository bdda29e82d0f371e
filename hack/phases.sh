#!/usr/bin/env bash
# phases.sh TARGET...: make test's runner. Runs each make target in turn,
# stops at the first that fails, and prints the time and CPU seconds each
# took, last: CI keeps only the end of the output, so the table is what
# says where the time went, and which phase failed.
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
rows=() rc=0 start=$SECONDS cpu_all=0
for target in "$@"; do
	t0=$SECONDS
	cpu_run "phase-$target" $MAKE --no-print-directory "$target"
	rc=$?
	cpu_all=$((cpu_all + CPU_SECONDS))
	rows+=("$(printf '%-12s %5d s %6d cpu-s  %s' "$target" $((SECONDS - t0)) "$CPU_SECONDS" "$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)")")")
	((rc == 0)) || break
done
echo
echo "make test: $((SECONDS - start)) s, $cpu_all CPU s in all"
printf '  %s\n' "${rows[@]}"
exit "$rc"
