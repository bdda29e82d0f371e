#!/usr/bin/env bash
# all.sh (make bench) runs every benchmark the project has and writes one
# markdown report with the machine, the kernels, the parameters and each
# benchmark's table (medians of several runs, with the ratios to its anchor
# measured in the same run): the engine against fio on this machine
# (hack/bench/engine.sh), one ublk volume against the kernel loop device in
# the VM on each kernel (hack/vm/bench.sh), first writes into a fresh sparse
# volume against loop on a fresh sparse file, with and without preallocation
# (bench.sh --sparse --prealloc), and 1, 8,
# 16 and 64 volumes at once against as many loop devices
# (hack/vm/bench-scale.sh), and noisy neighbours: one quiet volume at 4k
# randread iodepth 1 beside 15 busy ones against the same on 16 loop devices
# (bench-scale.sh --noisy), and what a restore and a clone copying in the
# background cost a volume in use on their node, on this machine and in the
# VM (hack/bench/copy.sh). Benchmarks, not tests: it fails only when a
# benchmark fails to run. Studies beyond this report (profiles, ablations,
# sweeps) are in docs/benchmark-studies.md.
#
# Environment: BENCH_REPS (default 3), BENCH_RUNTIME (seconds per fio run,
#   default 10), BENCH_ONLY (space-separated subset, in order, of: scale
#   noisy vm sparse engine copy), BENCH_SCALE_ARGS (extra bench-scale.sh flags, e.g.
#   --variants), BENCH_NOISY_ARGS
#   (extra bench-scale.sh --noisy flags, e.g. --kernel 6.12), BENCH_REFERENCE
#   (a directory with a reference ublk server, ublksrv's statically linked
#   ublk and ublk.loop, built beside the project: the noisy-neighbour tables
#   then have its column, "ref"; see bench-scale.sh --reference), BENCH_OUT (default
#   bin/benchmarks.md); UPDATE_DOCS=1 also copies the report to
#   docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

reps=${BENCH_REPS:-3}
runtime=${BENCH_RUNTIME:-10}
only=${BENCH_ONLY:-"scale noisy vm sparse engine copy"}
out=${BENCH_OUT:-bin/benchmarks.md}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# report_lines drops from a benchmark's output what only its log needs: the
# per-run lines the medians are made of (SCALE, BENCH), the guest's console
# and kernel messages, and per-queue counters (all kept in bin/vm/*.log).
report_lines() {
	grep -Ev '^(SCALE|BENCH) |^\[ *[0-9]+\.[0-9]+\]|^SeaBIOS|^Booting from|^Probing EDD|^bench: ublk queue [0-9]+:|^@@FASTBLK' || true
}

# section TITLE COMMAND... runs a benchmark, keeps its output for the
# report, and records a failure without stopping the others.
section() {
	local title=$1
	shift
	echo "== $title: $*" >&2
	local t0=$SECONDS rc=0
	"$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
	{
		echo "## $title"
		echo
		echo "Command: \`$(printf '%q ' "$@" | sed 's/ $//')\` ($((SECONDS - t0)) s$( ((rc == 0)) || echo ", FAILED with exit $rc"))"
		echo
		echo '```'
		report_lines <"$tmp/out"
		echo '```'
		echo
	} >>"$tmp/report"
	((rc == 0)) || { status=1; tail -20 "$tmp/err" >&2; }
	# The report so far, so that an interrupted run keeps what it measured.
	cp "$tmp/report" "$out"
}

{
	echo "# csi-fastblk benchmarks"
	echo
	echo "Made by \`make bench\` (hack/bench/all.sh) on $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with local changes)')."
	echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'))," \
		"$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), host kernel $(uname -r)."
	echo "VM figures are measured under qemu TCG (no KVM): only ratios within one run mean anything."
	echo "Repetitions: $reps; fio runs of ${runtime} s. Every ratio is to an anchor measured in the same run."
	echo "Profiles, ablations, tuning sweeps and A/Bs of server options: [benchmark-studies.md](benchmark-studies.md)."
	echo
} >"$tmp/report"

for b in $only; do
	case $b in
	engine) section "Engine against fio (this machine)" env REPS="$reps" RUNTIME="$runtime" hack/bench/engine.sh ;;
	vm) section "One ublk volume against the kernel loop device (VM)" hack/vm/bench.sh --reps "$reps" --runtime "$runtime" ;;
	sparse) section "First writes into a fresh sparse volume (VM)" hack/vm/bench.sh --sparse --prealloc 'falloc zero' \
		--only 'randwrite-qd32-j1 randwrite-qd32-j2' --reps "$reps" --runtime "$runtime" ;;
	scale)
		# shellcheck disable=SC2086 # flags, split on purpose
		section "Many volumes at once (VM)" hack/vm/bench-scale.sh --volumes '8 16 64' --variants 'ours shared=--ublk-thread-policy=shared' ${BENCH_SCALE_ARGS:-} \
			--reps "$reps" --runtime "$runtime"
		;;
	noisy)
		ref=()
		[[ -z ${BENCH_REFERENCE:-} ]] || ref=(--reference "$BENCH_REFERENCE")
		# Both thread policies, interleaved: the default (a thread per
		# device) and shared threads.
		# shellcheck disable=SC2086 # flags, split on purpose
		section "Noisy neighbours (VM)" hack/vm/bench-scale.sh --noisy --variants 'ours shared=--ublk-thread-policy=shared' \
			${BENCH_NOISY_ARGS:-} "${ref[@]}" --reps "$reps" --runtime "$runtime"
		[[ -n ${BENCH_REFERENCE:-} ]] || printf '%s\n\n' "No reference server was given (BENCH_REFERENCE): the table has no ref rows." >>"$tmp/report" &&
			cp "$tmp/report" "$out"
		;;
	copy) section "Background copies beside a volume in use (this machine and VM)" env BENCH_REPS="$reps" hack/bench/copy.sh ;;
	*) echo "unknown benchmark $b (want engine, vm, sparse, scale, noisy or copy)" >&2; exit 2 ;;
	esac
done
echo "report: $out" >&2
if [[ ${UPDATE_DOCS:-0} == 1 ]]; then
	cp "$out" docs/benchmarks.md
	echo "copied to docs/benchmarks.md" >&2
fi
exit "$status"
