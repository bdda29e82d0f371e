#!/usr/bin/env bash
# bench-scale.sh measures csi-fastblk at node scale in the VM: 1, 16 and 64
# volumes busy at once (each created, staged and published over CSI), fio 4k
# random at iodepth 4 on every volume, against one volume at 2 jobs x iodepth
# 32 (the same total depth as 16 volumes) and against as many kernel loop
# devices with direct I/O, in one VM run per kernel (guest side:
# guest/bench-scale.sh). Per kernel it prints a table of median IOPS, the
# share of the single-device figure, the ratio to loop, and the plugin's
# threads, RSS, CPU and context switches per I/O, attach and stage times. A
# benchmark, not a test: it fails only when a VM run fails.
#
# Usage: hack/vm/bench-scale.sh [--kernel 6.12|7.3] [--runtime S] [--reps N]
#                               [--volumes 'N...'] [--rw 'randread randwrite']
#                               [--compare]
#   --compare   also measure the thread-per-queue design (--ublk-thread-per-queue)
# Environment: BENCH_VM_SKIP_BUILD=1 reuses the last images; BENCH_VM_LOGDIR
#   (default bin/vm).
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

kernels=("${VM_KERNELS[@]}") runtime=10 reps=3 volumes="16 64" rws="randread randwrite" compare=0
while (($#)); do
	case "$1" in
	--kernel) kernel_dir "${2:?}" >/dev/null; kernels=("$2"); shift 2 ;;
	--runtime) runtime=${2:?}; shift 2 ;;
	--reps) reps=${2:?}; shift 2 ;;
	--volumes) volumes=${2:?}; shift 2 ;;
	--rw) rws=${2:?}; shift 2 ;;
	--compare) compare=1; shift ;;
	*) sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[[ $runtime =~ ^[0-9]+$ && $reps =~ ^[0-9]+$ ]] || die "--runtime and --reps take whole numbers"
logdir=${BENCH_VM_LOGDIR:-$REPO_ROOT/bin/vm}
mkdir -p "$logdir"
if [[ ${BENCH_VM_SKIP_BUILD:-0} != 1 ]]; then
	"$VM_DIR/kernels.sh"
	"$VM_DIR/initramfs.sh"
fi
nlabels=$((2 + compare))
nruns=$((nlabels * $(wc -w <<<"$rws") * (1 + $(wc -w <<<"$volumes"))))
timeout=$((reps * nruns * (runtime + 60) + 600))
guest="BENCH_RUNTIME=$runtime BENCH_REPS=$reps BENCH_SCALE_VOLUMES='$volumes' BENCH_SCALE_RW='$rws' BENCH_SCALE_COMPARE=$compare"
guest+=" /opt/fastblk/vm/bench-scale.sh"

# table LOG prints, per workload, device kind and volume count, the median
# IOPS, its share of the same kind's single device (the anchor), its ratio
# to loop with as many devices, and the plugin's figures (medians).
table() {
	awk '
	function median(list,   n, v, i, j, t) {
		n = split(list, v, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
		if (n == 0) return ""
		return n % 2 ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2
	}
	/^SCALE / && $4 != "failed" {
		label = $3; delete kv
		for (i = 4; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
		key = kv["rw"] SUBSEP label SUBSEP kv["volumes"]
		if (!(kv["rw"] in seenrw)) { seenrw[kv["rw"]] = 1; rw[++nrw] = kv["rw"] }
		if (!(label in seenl)) { seenl[label] = 1; labels[++nl] = label }
		if (!(kv["volumes"] in seenv)) { seenv[kv["volumes"]] = 1; vols[++nv] = kv["volumes"] + 0 }
		if (kv["iops"] != "-") iops[key] = iops[key] " " kv["iops"]
		split("threads rss_mib cpu_us_per_io ctxsw_per_io attach_ms_median attach_ms_max stage_mkfs_ms_median stage_mkfs_ms_max", names, " ")
		for (n in names) if (names[n] in kv) fig[key, names[n]] = fig[key, names[n]] " " kv[names[n]]
	}
	/^SCALE / && $4 == "failed" { failed++ }
	END {
		for (i = 2; i <= nv; i++) for (j = i; j > 1 && vols[j-1] > vols[j]; j--) { t = vols[j]; vols[j] = vols[j-1]; vols[j-1] = t }
		printf "  %-9s %-8s %7s %9s %6s %6s %7s %7s %8s %8s %11s %11s\n", "rw", "design", "volumes", "iops", "share", "/loop",
			"threads", "rss_mib", "cpu_us/io", "ctxsw/io", "attach_ms", "stage+mkfs"
		for (a = 1; a <= nrw; a++) for (b = 1; b <= nl; b++) for (c = 1; c <= nv; c++) {
			r = rw[a]; l = labels[b]; v = vols[c]; key = r SUBSEP l SUBSEP v
			if (!(key in iops)) continue
			m = median(iops[key]); anchor = median(iops[r, l, 1]); lp = median(iops[r, "loop", v])
			share = (anchor > 0) ? sprintf("%.2f", m / anchor) : "-"
			vsloop = (l != "loop" && lp > 0) ? sprintf("%.2f", m / lp) : "-"
			att = ((key, "attach_ms_median") in fig) ? sprintf("%s/%s", median(fig[key, "attach_ms_median"]), median(fig[key, "attach_ms_max"])) : "-"
			stg = ((key, "stage_mkfs_ms_median") in fig) ? sprintf("%s/%s", median(fig[key, "stage_mkfs_ms_median"]), median(fig[key, "stage_mkfs_ms_max"])) : "-"
			printf "  %-9s %-8s %7d %9.0f %6s %6s %7s %7s %8s %8s %11s %11s\n", r, l, v, m, share, vsloop,
				median(fig[key, "threads"]) == "" ? "-" : median(fig[key, "threads"]),
				median(fig[key, "rss_mib"]) == "" ? "-" : median(fig[key, "rss_mib"]),
				median(fig[key, "cpu_us_per_io"]) == "" ? "-" : median(fig[key, "cpu_us_per_io"]),
				median(fig[key, "ctxsw_per_io"]) == "" ? "-" : median(fig[key, "ctxsw_per_io"]), att, stg
		}
		if (failed) printf "  (%d runs failed: see the log)\n", failed
	}' "$1"
}

declare -A status=()
for k in "${kernels[@]}"; do
	set +e
	"$VM_DIR/run.sh" --kernel "$k" --disk-size 16G --timeout "$timeout" \
		--log "$logdir/bench-scale-$k.log" -- "$guest"
	status[$k]=$?
	set -e
done

failed=0
echo
echo "==== bench-scale: medians of $reps runs of ${runtime}s, fio io_uring direct=1 4k; volumes at iodepth 4 each, anchor (volumes 1) 2 jobs x iodepth 32 ===="
echo "     share: of the same design's single device; /loop: of as many kernel loop devices; attach and stage+mkfs: median/worst ms"
for k in "${kernels[@]}"; do
	log="$logdir/bench-scale-$k.log"
	((status[$k] == 0)) || failed=1
	echo "-- kernel $(cat "$(kernel_dir "$k")/release")$( ((status[$k] == 0)) || echo " (VM run FAILED, exit ${status[$k]})")"
	grep -a -E '^bench-scale: ' "$log" | sed 's/^/  /' | head -20 || true
	table "$log"
done
exit "$failed"
