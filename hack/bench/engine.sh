#!/usr/bin/env bash
# Benchmark csi-fastblk's io_uring engine against fio's io_uring engine on
# the same file, same parameters, alternating runs; print medians, the IOPS
# ratio ours/fio, context switches and syscalls per I/O for both, and ours
# again with batched submission (--submit-batch 0) to show what it costs.
#
# Environment: BIN (default bin/csi-fastblk), FILE (default
# /var/tmp/csi-fastblk-bench.img, must be on a real disk, not tmpfs), SIZE_MB
# (1024), RUNTIME (seconds, 5), REPS (11), CELLS ("randread:1 randread:2
# randwrite:1 randwrite:2"), BS (4k), IODEPTH (32), CPU_CELLS ("randread:1
# randwrite:1"; empty skips the CPU-bound tmpfs cells), CPU_REPS (5).
#
# Context switches and syscalls come from `perf stat -e
# context-switches,raw_syscalls:sys_enter` around each run (whole process
# tree, start-up included) when perf works; otherwise from each tool's own
# counters (our getrusage and io_uring_enter count; fio's ctx), marked "-"
# for fio syscalls.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-bin/csi-fastblk}
FILE=${FILE:-/var/tmp/csi-fastblk-bench.img}
SIZE_MB=${SIZE_MB:-1024}
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-11}
BS=${BS:-4k}
IODEPTH=${IODEPTH:-32}
CELLS=${CELLS-"randread:1 randread:2 randwrite:1 randwrite:2"}
OUT=${OUT:-bin/bench-engine}
DIRECT=1
CPU_CELLS=${CPU_CELLS-"randread:1 randwrite:1"}
CPU_REPS=${CPU_REPS:-5}

need() { # command package
	command -v "$1" >/dev/null 2>&1 && return 0
	if [ "$(id -u)" -ne 0 ]; then echo "need $1 (apt-get install $2) and not root" >&2; exit 1; fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need fio fio
need jq jq
command -v perf >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null 2>&1 || true
[ -x "$BIN" ] || { echo "$BIN missing: run make build" >&2; exit 1; }

fstype=$(stat -f -c %T "$(dirname "$FILE")")
if [ "$fstype" = tmpfs ]; then echo "$FILE is on tmpfs; use a real disk" >&2; exit 1; fi
want=$((SIZE_MB * 1024 * 1024))
have=$(stat -c %s "$FILE" 2>/dev/null || echo 0)
alloc=$(( $(stat -c %b "$FILE" 2>/dev/null || echo 0) * 512 ))
if [ "$have" -lt "$want" ] || [ "$alloc" -lt "$want" ]; then
	echo "writing ${SIZE_MB} MiB to $FILE ..."
	dd if=/dev/urandom of="$FILE" bs=1M count="$SIZE_MB" oflag=direct status=none
	sync
fi

PERF=()
if perf stat -e context-switches,raw_syscalls:sys_enter -x, -o /dev/null true 2>/dev/null; then
	PERF=(perf stat -e context-switches,raw_syscalls:sys_enter -x, -o)
	counters="perf stat (context-switches, raw_syscalls:sys_enter; whole process, start-up included)"
else
	counters="tool counters (ours: getrusage + io_uring_enter count; fio: ctx; fio syscalls unknown)"
fi
mkdir -p "$OUT"

# perfval FILE EVENT -> count
perfval() { awk -F, -v e="$2" '$3==e {print $1}' "$1"; }

# run_ours and run_fio run one measurement on $FILE with $DIRECT, $RUNTIME
# and $SIZE_MB (the CPU-bound cells set them per call) and print
# "IOPS cs/IO sc/IO p99"; VARIANT names the raw result files apart.
run_ours() { # rw jobs rep [variant submit-batch]
	local tag="$OUT/ours${4:-}-$1-$2-$3" args=(bench engine --file "$FILE" --rw "$1" --bs "$BS"
		--iodepth "$IODEPTH" --jobs "$2" --runtime "${RUNTIME}s" --direct="$DIRECT" --json --submit-batch "${5:-1}")
	if [ ${#PERF[@]} -gt 0 ]; then "${PERF[@]}" "$tag.perf" "$BIN" "${args[@]}" >"$tag.json"
	else "$BIN" "${args[@]}" >"$tag.json"; fi
	local iops ios cs sc
	iops=$(jq .iops "$tag.json")
	ios=$(jq "(.iops * $RUNTIME)" "$tag.json")
	if [ ${#PERF[@]} -gt 0 ]; then
		cs=$(perfval "$tag.perf" context-switches); sc=$(perfval "$tag.perf" raw_syscalls:sys_enter)
	else
		cs=$(jq .ctx_switches "$tag.json"); sc=$(jq .io_uring_enter "$tag.json")
	fi
	echo "$iops $(awk -v c="$cs" -v n="$ios" 'BEGIN{printf "%.4f", c/n}') $(awk -v c="$sc" -v n="$ios" 'BEGIN{printf "%.4f", c/n}') $(jq '.clat_usec.p99' "$tag.json")"
}

run_fio() { # rw jobs rep [variant]
	local tag="$OUT/fio${4:-}-$1-$2-$3" args=(--name=bench --filename="$FILE" --size="${SIZE_MB}m" --rw="$1" --bs="$BS"
		--iodepth="$IODEPTH" --numjobs="$2" --runtime="$RUNTIME" --time_based --ioengine=io_uring
		--direct="$DIRECT" --hipri=0 --registerfiles --fixedbufs --group_reporting --output-format=json)
	if [ ${#PERF[@]} -gt 0 ]; then "${PERF[@]}" "$tag.perf" fio "${args[@]}" >"$tag.json"
	else fio "${args[@]}" >"$tag.json"; fi
	local dir=read; case $1 in *write) dir=write ;; esac
	local iops ios cs sc
	iops=$(jq ".jobs[0].$dir.iops" "$tag.json")
	ios=$(jq ".jobs[0].$dir.total_ios" "$tag.json")
	if [ ${#PERF[@]} -gt 0 ]; then
		cs=$(perfval "$tag.perf" context-switches); sc=$(perfval "$tag.perf" raw_syscalls:sys_enter)
	else
		cs=$(jq '.jobs[0].ctx' "$tag.json"); sc=NaN
	fi
	echo "$iops $(awk -v c="$cs" -v n="$ios" 'BEGIN{printf "%.4f", c/n}') $(awk -v c="$sc" -v n="$ios" 'BEGIN{printf "%.4f", c/n}') $(jq ".jobs[0].$dir.clat_ns.percentile[\"99.000000\"] / 1000" "$tag.json")"
}

median() { sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }
col() { awk -v c="$2" '{print $c}' "$1" | median; } # col FILE N: median of column N

echo "engine bench: bs=$BS iodepth=$IODEPTH runtime=${RUNTIME}s reps=$REPS file=$FILE ($fstype) kernel $(uname -r)"
echo "counters: $counters"
printf '%-10s %4s | %10s %10s %6s %6s | %8s %8s | %8s %8s | %9s %9s | %10s %6s\n' rw jobs "ours IOPS" "fio IOPS" ratio pairs \
	"ours cs" "fio cs" "ours sc" "fio sc" "ours p99" "fio p99" "batch IOPS" ratio
fail=0
for cell in $CELLS; do
	rw=${cell%%:*}; jobs=${cell##*:}
	: >"$OUT/$rw-$jobs.ours"; : >"$OUT/$rw-$jobs.fio"; : >"$OUT/$rw-$jobs.batch"
	for rep in $(seq 1 "$REPS"); do
		if [ $((rep % 2)) -eq 1 ]; then
			run_ours "$rw" "$jobs" "$rep" >>"$OUT/$rw-$jobs.ours"; run_fio "$rw" "$jobs" "$rep" >>"$OUT/$rw-$jobs.fio"
		else
			run_fio "$rw" "$jobs" "$rep" >>"$OUT/$rw-$jobs.fio"; run_ours "$rw" "$jobs" "$rep" >>"$OUT/$rw-$jobs.ours"
		fi
		run_ours "$rw" "$jobs" "$rep" -batch 0 >>"$OUT/$rw-$jobs.batch"
	done
	oi=$(col "$OUT/$rw-$jobs.ours" 1); fi_=$(col "$OUT/$rw-$jobs.fio" 1)
	ratio=$(awk -v a="$oi" -v b="$fi_" 'BEGIN{printf "%.3f", a/b}')
	# median of the ratios of each back-to-back pair: cancels device drift
	pairs=$(paste -d' ' "$OUT/$rw-$jobs.ours" "$OUT/$rw-$jobs.fio" | awk '{printf "%.3f\n", $1/$5}' | median)
	awk -v r="$ratio" 'BEGIN{exit !(r < 0.97)}' && fail=1
	bi=$(col "$OUT/$rw-$jobs.batch" 1)
	printf '%-10s %4s | %10.0f %10.0f %6s %6.3f | %8s %8s | %8s %8s | %9.1f %9.1f | %10.0f %6s\n' "$rw" "$jobs" "$oi" "$fi_" "$ratio" "$pairs" \
		"$(col "$OUT/$rw-$jobs.ours" 2)" "$(col "$OUT/$rw-$jobs.fio" 2)" \
		"$(col "$OUT/$rw-$jobs.ours" 3)" "$(col "$OUT/$rw-$jobs.fio" 3)" \
		"$(col "$OUT/$rw-$jobs.ours" 4)" "$(col "$OUT/$rw-$jobs.fio" 4)" \
		"$bi" "$(awk -v a="$bi" -v b="$fi_" 'BEGIN{printf "%.3f", a/b}')"
done
# The engine's own cost per I/O, without the disk: buffered 4k I/O on a tmpfs
# file is CPU-bound, so IOPS there compare the two engines' submission and
# completion paths alone (the disk cells above also measure the disk's noise).
if [ -n "$CPU_CELLS" ] && [ -d /dev/shm ]; then
	shm=/dev/shm/csi-fastblk-bench-cpu.img
	dd if=/dev/urandom of="$shm" bs=1M count=256 status=none
	for cell in $CPU_CELLS; do
		rw=${cell%%:*}; jobs=${cell##*:}
		: >"$OUT/cpu-$rw-$jobs.ours"; : >"$OUT/cpu-$rw-$jobs.fio"
		for rep in $(seq 1 "$CPU_REPS"); do
			FILE=$shm SIZE_MB=256 RUNTIME=3 DIRECT=0 run_ours "$rw" "$jobs" "$rep" -cpu >>"$OUT/cpu-$rw-$jobs.ours"
			FILE=$shm SIZE_MB=256 RUNTIME=3 DIRECT=0 run_fio "$rw" "$jobs" "$rep" -cpu >>"$OUT/cpu-$rw-$jobs.fio"
		done
		oi=$(col "$OUT/cpu-$rw-$jobs.ours" 1); fi_=$(col "$OUT/cpu-$rw-$jobs.fio" 1)
		printf 'cpu-bound %-10s %s job(s), buffered on tmpfs: ours %10.0f  fio %10.0f  ratio %.3f\n' "$rw" "$jobs" "$oi" "$fi_" \
			"$(awk -v a="$oi" -v b="$fi_" 'BEGIN{print a/b}')"
	done
	rm -f "$shm"
fi
echo "medians of $REPS alternating runs; ratio = median ours / median fio, pairs = median of per-pair ratios;"
echo "cs = context switches per I/O, sc = syscalls per I/O, p99 = clat usec;"
echo "ours submits each I/O as its slot frees (--submit-batch 1); batch = all ready I/Os in one enter (--submit-batch 0)"
echo "raw results: $OUT"
[ "$fail" -eq 0 ] || echo "NOTE: at least one cell below the 0.97 IOPS target"
