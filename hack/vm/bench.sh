#!/usr/bin/env bash
# bench.sh (make bench-vm) measures a csi-fastblk ublk volume against the
# kernel loop device with direct I/O, on the same backing file on the same
# virtio disk, in one VM run per kernel (guest side: guest/bench.sh), and prints
# per kernel a table of medians (with their spread), the ratio of the ublk and loop medians, and
# the median of the per-repetition ublk/loop ratios ("pairs": each pair ran
# back to back, so it is the figure least moved by the host's drift). A
# benchmark, not a test: it fails only when a VM run fails.
#
# Usage: hack/vm/bench.sh [--kernel 6.12|7.3] [--runtime S] [--reps N]
#                         [--size SIZE] [--only 'WORKLOAD...'] [--ublk-args 'ARGS']
#                         [--compare 'ARGS'] [--sparse [--prealloc 'MODES']]
#                         [--seq-depth N] [--profile]
#   --runtime S     seconds per fio run (default 10, plus 2 s ramp)
#   --reps N        repetitions, alternating ublk/loop order (default 3)
#   --size SIZE     backing file size (default 2G)
#   --only          workloads to run (default all: randread-qd32-j1
#                   randread-qd32-j2 randwrite-qd32-j1 randwrite-qd32-j2 read-1m
#                   write-1m randread-qd1-lat randwrite-qd1-lat)
#   --ublk-args     extra flags for csi-fastblk ublk serve (e.g. '--zero-copy off')
#   --compare ARGS  also measure a second ublk device ("ublk2") served with
#                   ARGS on top, in the same rotation: an A/B of server options
#   --sparse        leave the backing file all holes and punch it again before
#                   each write run, so every run's writes allocate blocks (the
#                   worst case of a fresh volume; meant with --only write loads)
#   --prealloc MODES with --sparse, also measure the fresh file preallocated,
#                   as devices ublk+MODE and loop+MODE in the same rotation:
#                   falloc (fallocate mode 0: what the StorageClass parameter
#                   preallocation=falloc leaves) and/or zero (zeros written
#                   over the file: what preallocation=full leaves)
#   --seq-depth N   iodepth of read-1m and write-1m (default 16)
#   --profile       after the repetitions, one more run of each workload on
#                   each device under perf (whole guest, cpu-clock, call
#                   graphs; an unstripped binary and an initramfs with perf
#                   are built): its figure and the report's top entries are
#                   printed per kernel, and are not in the medians
# Environment: BENCH_VM_SKIP_BUILD=1 reuses the last images; BENCH_VM_LOGDIR
#   (default bin/vm).
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

kernels=("${VM_KERNELS[@]}") runtime=10 reps=3 size=2G only="" ublk_args="" compare="" sparse=0 prealloc="" seqdepth="" profile=0
while (($#)); do
	case "$1" in
	--kernel) kernel_dir "${2:?}" >/dev/null; kernels=("$2"); shift 2 ;;
	--runtime) runtime=${2:?}; shift 2 ;;
	--reps) reps=${2:?}; shift 2 ;;
	--size) size=${2:?}; shift 2 ;;
	--only) only=${2:?}; shift 2 ;;
	--ublk-args) ublk_args=${2:?}; shift 2 ;;
	--compare) compare=${2:?}; shift 2 ;;
	--sparse) sparse=1; shift ;;
	--prealloc) prealloc=${2:?}; shift 2 ;;
	--seq-depth) seqdepth=${2:?}; shift 2 ;;
	--profile) profile=1; shift ;;
	*) sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[[ $runtime =~ ^[0-9]+$ && $reps =~ ^[0-9]+$ && $seqdepth =~ ^[0-9]*$ ]] || die "--runtime, --reps and --seq-depth take whole numbers"
[[ -z $prealloc || $sparse == 1 ]] || die "--prealloc needs --sparse"
for m in $prealloc; do [[ $m == falloc || $m == zero ]] || die "--prealloc: unknown mode $m (falloc, zero)"; done
logdir=${BENCH_VM_LOGDIR:-$REPO_ROOT/bin/vm}
mkdir -p "$logdir"

if [[ ${BENCH_VM_SKIP_BUILD:-0} != 1 ]]; then
	if ((profile)); then
		# Symbols for perf: make static strips them.
		(cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -tags ablation -o bin/csi-fastblk-static ./cmd/csi-fastblk)
	fi
	"$VM_DIR/kernels.sh"
	VM_PERF=$profile "$VM_DIR/initramfs.sh"
fi

nwl=$(wc -w <<<"${only:-a b c d e f g h}")
# Each fio run takes runtime + 2 s ramp + a few seconds of start-up under TCG.
ndev=2
[[ -z $compare ]] || ndev=3
nmodes=$(wc -w <<<"$prealloc")
ndev=$((ndev + 2 * nmodes))
timeout=$((nwl * ndev * (reps + profile) * (runtime + 8) + 600))
# Writing zeros over the whole file before each of those runs takes longer.
[[ $prealloc != *zero* ]] || timeout=$((timeout + nwl * 2 * reps * 60))
guest="BENCH_RUNTIME=$runtime BENCH_REPS=$reps BENCH_SIZE=$size"
[[ -z $only ]] || guest+=" BENCH_ONLY='$only'"
[[ -z $ublk_args ]] || guest+=" BENCH_UBLK_ARGS='$ublk_args'"
[[ -z $compare ]] || guest+=" BENCH_UBLK2_ARGS='$compare'"
((sparse == 0)) || guest+=" BENCH_SPARSE=1"
[[ -z $prealloc ]] || guest+=" BENCH_PREALLOC='$prealloc'"
[[ -z $seqdepth ]] || guest+=" BENCH_SEQ_DEPTH=$seqdepth"
((profile == 0)) || guest+=" BENCH_PROFILE=1"
guest+=" /opt/fastblk/vm/bench.sh"

# table LOG prints, per workload and per device other than loop (ublk, and
# ublk2 with --compare; with --prealloc, ublk+MODE and loop+MODE), the
# medians, their ratio to the reference device's and the median of the
# per-repetition ratios to it ("pairs"), from the BENCH lines in LOG. The
# reference is loop; a preallocated ublk device (ublk+MODE) gets a second row
# against the loop device on the same preallocated file (loop+MODE).
table() {
	awk "$AWK_MEDIAN"'
	/^BENCH / {
		wl = $2; dev = $3
		if (!(wl in seen)) { seen[wl] = 1; order[++nw] = wl }
		if (dev != "loop" && !(dev in isdev)) { isdev[dev] = 1; devs[++nd] = dev }
		if ($5 == "FAIL" || $5 == "-") { fails[wl, dev]++; next }
		vals[wl, dev] = vals[wl, dev] " " $5; unit[wl] = $6; runs[wl, dev]++
		rep[wl, $4, dev] = $5
	}
	function spread(list,   n, v, i, lo, hi) {
		n = split(list, v, " ")
		if (n == 0) return "-"
		lo = hi = v[1] + 0
		for (i = 2; i <= n; i++) { if (v[i] + 0 < lo) lo = v[i] + 0; if (v[i] + 0 > hi) hi = v[i] + 0 }
		return lo "-" hi
	}
	function row(wl, d, ref,    u, l, p, r, pairs, key, f) {
		u = median(vals[wl, d]); l = median(vals[wl, ref]); pairs = ""
		for (key in rep) {
			split(key, f, SUBSEP)
			if (f[1] == wl && f[3] == d && (wl, f[2], ref) in rep && rep[wl, f[2], ref] > 0)
				pairs = pairs " " rep[key] / rep[wl, f[2], ref]
		}
		p = median(pairs)
		r = (u != "" && l > 0) ? sprintf("%.2f", u / l) : "-"
		printf "  %-18s %-6s %-12s %-12s %10s %11s %10s %11s %8s %6s  %d/%d%s\n", wl, unit[wl], d, ref, u == "" ? "-" : u, spread(vals[wl, d]),
			l == "" ? "-" : l, spread(vals[wl, ref]), r,
			p == "" ? "-" : sprintf("%.2f", p),
			runs[wl, d], runs[wl, ref], (fails[wl, d] + fails[wl, ref]) ? "  (failed runs!)" : ""
	}
	END {
		printf "  %-18s %-6s %-12s %-12s %10s %11s %10s %11s %8s %6s  %s\n", "workload", "unit", "device", "ref", "value", "spread", "ref value", "ref spread", "dev/ref", "pairs", "runs (dev/ref)"
		for (i = 1; i <= nw; i++) {
			wl = order[i]
			for (k = 1; k <= nd; k++) {
				d = devs[k]
				row(wl, d, "loop")
				if (d ~ /^ublk[0-9]*\+/) {
					m = d; sub(/^[^+]*\+/, "", m)
					if (("loop+" m) in isdev) row(wl, d, "loop+" m)
				}
			}
		}
	}' "$1"
}

# iowq LOG prints, per workload and ublk device, the medians over the
# repetitions of the IOWQ lines in LOG: the most io-wq workers the server had
# alive at once during a run, and the CPU seconds they and the server's other
# threads took in it.
iowq() {
	awk "$AWK_MEDIAN"'
	/^IOWQ / {
		k = $2 " " $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
		w[k] = w[k] " " $6; c[k] = c[k] " " $8; s[k] = s[k] " " $10
	}
	END {
		if (n) printf "  %-30s %8s %11s %13s  (io-wq, medians)\n", "workload device", "workers", "iowq_cpu_s", "server_cpu_s"
		for (i = 1; i <= n; i++) { k = order[i]; printf "  %-30s %8s %11s %13s\n", k, median(w[k]), median(c[k]), median(s[k]) }
	}' "$1"
}

declare -A status=()
for k in "${kernels[@]}"; do
	set +e
	"$VM_DIR/run.sh" --kernel "$k" --disk-size 8G --timeout "$timeout" \
		--log "$logdir/bench-$k.log" -- "$guest"
	status[$k]=$?
	set -e
done

failed=0
echo
echo "==== bench-vm: medians of $reps runs of ${runtime}s, fio io_uring direct=1 (latency: mean, lower is better) ===="
for k in "${kernels[@]}"; do
	log="$logdir/bench-$k.log"
	((status[$k] == 0)) || failed=1
	echo "-- kernel $(cat "$(kernel_dir "$k")/release")$( ((status[$k] == 0)) || echo " (VM run FAILED, exit ${status[$k]})")"
	grep -a -E '^bench: (ublk2? device|loop device|sparse|preallocated|csi-fastblk|ublk server memory)' "$log" | sed 's/^/  /' || true
	table "$log"
	iowq "$log"
	grep -a -E '^(PROFILED|PROFILE) ' "$log" | sed 's/^/  /' || true
done
exit "$failed"
