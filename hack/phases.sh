#!/usr/bin/env bash
# phases.sh TARGET...: make test's runner. Runs each make target in turn,
# stops at the first that fails, and prints the time each took, last: CI
# keeps only the end of the output, so the table is what says where the
# time went, and which phase failed.
set -uo pipefail
MAKE=${MAKE:-make}
rows=() rc=0 start=$SECONDS
for target in "$@"; do
	t0=$SECONDS
	$MAKE --no-print-directory "$target"
	rc=$?
	rows+=("$(printf '%-12s %5d s  %s' "$target" $((SECONDS - t0)) "$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)")")")
	((rc == 0)) || break
done
echo
echo "make test: $((SECONDS - start)) s in all"
printf '  %s\n' "${rows[@]}"
exit "$rc"
