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
#                               [--variants 'LABEL[=FLAGS]...'] [--no-loop]
#                               [--disks 'disk ram'] [--reference DIR]
#   --variants  the plugin set-ups to measure (default ours: the plugin's
#               defaults): LABEL=FLAGS
#               runs the plugin with
#               serve FLAGS joined by '+' (hidden benchmark flags such as
#               --ublk-ablate=reap-one, which needs a binary built with
#               -tags ablation as make bench-scale builds it, or
#               --ublk-thread-tags=1024, NAME=VALUE
#               for its environment, params=queues=1,queueDepth=64 for the
#               volumes' StorageClass parameters)
#   --no-loop   leave out the kernel loop devices
#   --disks     where the VM's data disk lives, one VM run and table each:
#               disk, a raw file on the host's disk (cache=none: the disk,
#               not the CPU, is the limit, as on a node), ram, a file on
#               /dev/shm (the guest is CPU-bound), or ramcap, that file
#               capped by qemu at 15000 IOPS (a fast disk with headroom that
#               every machine reproduces); default disk, and 'disk ramcap'
#               with --noisy
#   --ramcap N  the ramcap disk's cap in IOPS (default 15000); pick one that
#               loop's busy neighbours reach with CPU to spare (loop_x <= 4)
#   --lat       also the latency probe: 4k at iodepth 1 on one device, alone and
#               with 15 others busy at iodepth 4 (p50/p99/p99.9), for each
#               design, loop, and the backing files themselves ("file")
#   --lat-only  only the latency probe
#   --noisy     only the noisy-neighbour probe: one volume at 4k randread
#               iodepth 1 alone, then beside 15 others at 4k randwrite
#               iodepth 32; the quiet volume's mean and p99 latency and the
#               neighbours' IOPS, each design's as a ratio of loop's, and
#               the quiet volume's mean inside the server
#   --reference DIR
#               also a reference ublk server ("ref"): DIR holds ublksrv's
#               statically linked ublk and ublk.loop, built beside the
#               project (it is not built or shipped by it); each device is
#               its loop target with direct I/O, one daemon per device, as
#               many queues and as deep as the plugin's devices
#   --smp N     the VM's CPUs (default 2)
#   --profile   also one run of each csi-fastblk design and workload under perf
#               (whole guest, cpu-clock samples with call graphs; the plugin
#               is rebuilt with symbols), its top commands, DSOs and symbols
#               printed per kernel; the profiled runs are not in the medians;
#               with --noisy, the quiet volume beside the busy ones
# Environment: BENCH_VM_SKIP_BUILD=1 reuses the last images; BENCH_VM_LOGDIR
#   (default bin/vm).
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

# RAMCAP_IOPS caps the ramcap disk (--ramcap): a fast disk every machine
# reproduces, as long as the guest's CPUs can drive more than the cap.
RAMCAP_IOPS=15000
kernels=("${VM_KERNELS[@]}") runtime=10 reps=3 volumes="16 64" rws="randread randwrite" variants="" loop=1 lat=0 noscale=0 smp=2 profile=0 noisy=0 disks="" reference=""
while (($#)); do
	case "$1" in
	--kernel) kernel_dir "${2:?}" >/dev/null; kernels=("$2"); shift 2 ;;
	--runtime) runtime=${2:?}; shift 2 ;;
	--reps) reps=${2:?}; shift 2 ;;
	--volumes) volumes=${2:?}; shift 2 ;;
	--rw) rws=${2:?}; shift 2 ;;
	--variants) variants=${2:?}; shift 2 ;;
	--no-loop) loop=0; shift ;;
	--disks) disks=${2:?}; shift 2 ;;
	--lat) lat=1; shift ;;
	--lat-only) lat=1 noscale=1; shift ;;
	--noisy) lat=1 noscale=1 noisy=1 rws=randwrite; shift ;;
	--smp) smp=${2:?}; shift 2 ;;
	--profile) profile=1; shift ;;
	--reference) reference=$(realpath "${2:?}"); shift 2 ;;
	--ramcap) RAMCAP_IOPS=${2:?}; shift 2 ;;
	*) sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[[ $runtime =~ ^[0-9]+$ && $reps =~ ^[0-9]+$ ]] || die "--runtime and --reps take whole numbers"
((noisy)) && disks=${disks:-disk ramcap}
disks=${disks:-disk}
for d in $disks; do [[ $d == disk || $d == ram || $d == ramcap ]] || die "--disks: want disk, ram or ramcap, not $d"; done
if [[ -n $reference ]]; then
	for f in ublk ublk.loop; do
		[[ -x $reference/$f ]] || die "--reference $reference: no executable $f"
		file -L "$reference/$f" | grep -q 'statically linked' || die "--reference: $reference/$f is not statically linked (the guest has none of its libraries)"
	done
fi
logdir=${BENCH_VM_LOGDIR:-$REPO_ROOT/bin/vm}
mkdir -p "$logdir"
if [[ ${BENCH_VM_SKIP_BUILD:-0} != 1 ]]; then
	if ((profile)); then
		# Symbols for perf: make static strips them.
		(cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -tags ablation -o bin/csi-fastblk-static ./cmd/csi-fastblk)
	fi
	"$VM_DIR/kernels.sh"
	VM_PERF=$profile VM_REFERENCE=$reference "$VM_DIR/initramfs.sh"
fi
nlabels=$((1 + loop))
[[ -n $variants ]] && nlabels=$(($(wc -w <<<"$variants") + loop))
[[ -z $reference ]] || nlabels=$((nlabels + 1))
[[ $variants != *\'* && $variants != *'"'* ]] || die "--variants: no quotes"

nruns=$((nlabels * $(wc -w <<<"$rws") * (1 + $(wc -w <<<"$volumes"))))
nruns=$((nruns * (1 - noscale) + lat * (nlabels + loop) * $(wc -w <<<"$rws") * 2))
timeout=$((reps * nruns * (runtime + 60) + 600))
guest="BENCH_RUNTIME=$runtime BENCH_REPS=$reps BENCH_SCALE_VOLUMES='$volumes' BENCH_SCALE_RW='$rws'"
guest+=" BENCH_SCALE_VARIANTS='$variants' BENCH_SCALE_LOOP=$loop BENCH_SCALE_LAT=$lat BENCH_SCALE_NOSCALE=$noscale"
guest+=" BENCH_SCALE_PROFILE=$profile BENCH_SCALE_NOISY=$noisy BENCH_SCALE_REF=$([[ -n $reference ]] && echo 1 || echo 0)"
guest+=" /opt/fastblk/vm/bench-scale.sh"

# table LOG prints, per workload, device kind and volume count, the median
# IOPS, its share of the same kind's single device (the anchor), its ratio
# to loop with as many devices, and the plugin's figures (medians).
table() {
	awk "$AWK_MEDIAN"'
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
		printf "  %-9s %-14s %7s %9s %6s %6s %7s %7s %8s %8s %11s %11s\n", "rw", "design", "volumes", "iops", "share", "/loop",
			"threads", "rss_mib", "cpu_us/io", "ctxsw/io", "attach_ms", "stage+mkfs"
		for (a = 1; a <= nrw; a++) for (b = 1; b <= nl; b++) for (c = 1; c <= nv; c++) {
			r = rw[a]; l = labels[b]; v = vols[c]; key = r SUBSEP l SUBSEP v
			if (!(key in iops)) continue
			m = median(iops[key]); anchor = median(iops[r, l, 1]); lp = median(iops[r, "loop", v])
			share = (anchor > 0) ? sprintf("%.2f", m / anchor) : "-"
			vsloop = (l != "loop" && lp > 0) ? sprintf("%.2f", m / lp) : "-"
			att = ((key, "attach_ms_median") in fig) ? sprintf("%s/%s", median(fig[key, "attach_ms_median"]), median(fig[key, "attach_ms_max"])) : "-"
			stg = ((key, "stage_mkfs_ms_median") in fig) ? sprintf("%s/%s", median(fig[key, "stage_mkfs_ms_median"]), median(fig[key, "stage_mkfs_ms_max"])) : "-"
			printf "  %-9s %-14s %7d %9.0f %6s %6s %7s %7s %8s %8s %11s %11s\n", r, l, v, m, share, vsloop,
				median(fig[key, "threads"]) == "" ? "-" : median(fig[key, "threads"]),
				median(fig[key, "rss_mib"]) == "" ? "-" : median(fig[key, "rss_mib"]),
				median(fig[key, "cpu_us_per_io"]) == "" ? "-" : median(fig[key, "cpu_us_per_io"]),
				median(fig[key, "ctxsw_per_io"]) == "" ? "-" : median(fig[key, "ctxsw_per_io"]), att, stg
		}
		if (failed) printf "  (%d runs failed: see the log)\n", failed
	}' "$1"
}

# lattable LOG prints, per workload, design and busy count, the probe's
# median p50/p99/p99.9 completion latency (us) and its p50 and p99 as a
# ratio of loop's in the same run.
lattable() {
	awk "$AWK_MEDIAN"'
	/^LAT / && $4 != "failed" {
		label = $3; delete kv
		for (i = 4; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
		key = kv["rw"] SUBSEP label SUBSEP kv["busy"]
		if (!(kv["rw"] in seenrw)) { seenrw[kv["rw"]] = 1; rw[++nrw] = kv["rw"] }
		if (!(label in seenl)) { seenl[label] = 1; labels[++nl] = label }
		if (!(kv["busy"] in seenb)) { seenb[kv["busy"]] = 1; busy[++nb] = kv["busy"] + 0 }
		for (f in kv) if (f ~ /^p[0-9]+_us$/) fig[key, f] = fig[key, f] " " kv[f]
	}
	END {
		if (nl == 0) exit
		printf "\n  latency of one device at iodepth 1 (us), alone (busy 0) and with others at iodepth 4\n"
		printf "  %-9s %-14s %5s %9s %9s %9s %9s %9s\n", "rw", "design", "busy", "p50", "p99", "p99.9", "p50/loop", "p99/loop"
		for (a = 1; a <= nrw; a++) for (b = 1; b <= nl; b++) for (c = 1; c <= nb; c++) {
			key = rw[a] SUBSEP labels[b] SUBSEP busy[c]
			if (!((key, "p50_us") in fig)) continue
			lk = rw[a] SUBSEP "loop" SUBSEP busy[c]
			p50 = median(fig[key, "p50_us"]); p99 = median(fig[key, "p99_us"]); p999 = median(fig[key, "p999_us"])
			l50 = ((lk, "p50_us") in fig) ? median(fig[lk, "p50_us"]) : 0
			l99 = ((lk, "p99_us") in fig) ? median(fig[lk, "p99_us"]) : 0
			printf "  %-9s %-14s %5d %9.1f %9.1f %9.1f %9s %9s\n", rw[a], labels[b], busy[c], p50, p99, p999,
				(l50 > 0) ? sprintf("%.2f", p50 / l50) : "-", (l99 > 0) ? sprintf("%.2f", p99 / l99) : "-"
		}
	}' "$1"
}

# noisytable LOG prints, per design, the quiet volume's median mean and p99
# latency (us) alone (busy 0) and beside its busy neighbours, the
# neighbours' aggregate IOPS, and each as a ratio of loop's in the same run,
# with the spread (lowest-highest) of the mean and the IOPS over the runs;
# with a reference server (ref), also the neighbours' IOPS, the server's
# CPU and the guest's CPU per I/O as ratios of its. Every row ends with
# loop_x, loop's own quiet mean beside its busy neighbours as a multiple of
# its mean alone: the regime. Where it is over 4 the baseline starves too,
# and the table is no evidence of isolation (issue 54).
noisytable() {
	awk "$AWK_MEDIAN"'
	/^LAT / && $4 != "failed" {
		label = $3; delete kv
		for (i = 4; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
		key = label SUBSEP kv["busy"]
		if (!(label in seenl)) { seenl[label] = 1; labels[++nl] = label }
		if (!(kv["busy"] in seenb)) { seenb[kv["busy"]] = 1; busy[++nb] = kv["busy"] + 0 }
		n[key]++
		for (f in kv) if (f ~ /_us$/ || f ~ /_per_io$/ || f == "iops") fig[key, f] = fig[key, f] " " kv[f]
	}
	function ratio(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "-" }
	function spread(list,   v, k, lo, hi, i) {
		k = split(list, v, " ")
		if (k < 2) return "-"
		lo = hi = v[1] + 0
		for (i = 2; i <= k; i++) { if (v[i] + 0 < lo) lo = v[i] + 0; if (v[i] + 0 > hi) hi = v[i] + 0 }
		return (hi >= 1000) ? sprintf("%.0f-%.0f", lo, hi) : sprintf("%.1f-%.1f", lo, hi)
	}
	END {
		if (nl == 0) exit
		printf "\n  noisy neighbours: quiet volume 4k randread iodepth 1, alone (busy 0) and beside busy volumes at 4k randwrite iodepth 32\n"
		printf "  (fio: a process per volume; the quiet one its own process, started once its neighbours ran)\n"
		hasref = ("ref" SUBSEP 0) in n
		maxb = 0
		for (c = 1; c <= nb; c++) if (busy[c] > maxb) maxb = busy[c]
		la = ("loop" SUBSEP 0, "mean_us") in fig ? median(fig["loop" SUBSEP 0, "mean_us"]) : 0
		lb = ("loop" SUBSEP maxb, "mean_us") in fig ? median(fig["loop" SUBSEP maxb, "mean_us"]) : 0
		loopx = ratio(lb, la)
		printf "  %-14s %5s %4s %9s %13s %9s %11s %11s %9s %9s %10s %10s %10s %9s %11s %6s%s\n", "design", "busy", "runs", "mean_us", "(spread)", "p99_us", "neigh_iops", "(spread)", "mean/loop", "p99/loop", "iops/loop", "server_us", "cpu_us/io", "ctxsw/io", "guest_us/io", "loop_x",
			hasref ? sprintf(" %9s %9s %9s", "iops/ref", "cpu/ref", "guest/ref") : ""
		for (b = 1; b <= nl; b++) for (c = 1; c <= nb; c++) {
			key = labels[b] SUBSEP busy[c]; lk = "loop" SUBSEP busy[c]
			if (!((key, "p99_us") in fig)) continue
			m = median(fig[key, "mean_us"]); p99 = median(fig[key, "p99_us"]); io = median(fig[key, "iops"])
			lm = ((lk, "mean_us") in fig) ? median(fig[lk, "mean_us"]) : 0
			lp = ((lk, "p99_us") in fig) ? median(fig[lk, "p99_us"]) : 0
			li = ((lk, "iops") in fig) ? median(fig[lk, "iops"]) : 0
			sv = ((key, "server_mean_us") in fig) ? sprintf("%.1f", median(fig[key, "server_mean_us"])) : "-"
			cpu = ((key, "cpu_us_per_io") in fig) ? sprintf("%.1f", median(fig[key, "cpu_us_per_io"])) : "-"
			cs = ((key, "ctxsw_per_io") in fig) ? sprintf("%.3f", median(fig[key, "ctxsw_per_io"])) : "-"
			gc = ((key, "guest_cpu_us_per_io") in fig) ? sprintf("%.1f", median(fig[key, "guest_cpu_us_per_io"])) : "-"
			vsref = ""
			if (hasref) {
				rk = "ref" SUBSEP busy[c]
				ri = ((rk, "iops") in fig) ? median(fig[rk, "iops"]) : 0
				rc = ((rk, "cpu_us_per_io") in fig) ? median(fig[rk, "cpu_us_per_io"]) : 0
				rg = ((rk, "guest_cpu_us_per_io") in fig) ? median(fig[rk, "guest_cpu_us_per_io"]) : 0
				vsref = sprintf(" %9s %9s %9s", (busy[c] > 0) ? ratio(io, ri) : "-", (cpu != "-") ? ratio(cpu, rc) : "-", (gc != "-") ? ratio(gc, rg) : "-")
			}
			printf "  %-14s %5d %4d %9.1f %13s %9.1f %11.0f %11s %9s %9s %10s %10s %10s %9s %11s %6s%s\n", labels[b], busy[c], n[key], m, "(" spread(fig[key, "mean_us"]) ")", p99, io,
				(busy[c] > 0) ? "(" spread(fig[key, "iops"]) ")" : "-",
				ratio(m, lm), ratio(p99, lp), (busy[c] > 0) ? ratio(io, li) : "-", sv, cpu, cs, gc, loopx, vsref
		}
		if (loopx == "-") printf "  (no loop runs: no regime)\n"
		else if (loopx + 0 > 4) printf "  loop_x %s: loop\047s quiet volume starves beside its neighbours too; this table is no evidence of isolation\n", loopx
		else printf "  loop_x %s: the disk has headroom (loop\047s quiet volume within 4x of its alone mean): the regime of issue 54\n", loopx
	}' "$1"
}

# disk_dir REGIME is where run.sh makes the VM's data disk, and disk_opts
# its extra qemu -drive options.
disk_dir() {
	case $1 in
	disk) echo "$VM_CACHE/disks" ;;
	ram | ramcap) echo "/dev/shm/csi-fastblk-vm-disks" ;;
	esac
}
disk_opts() {
	case $1 in
	ramcap) echo "throttling.iops-total=$RAMCAP_IOPS" ;;
	esac
}
# disk_name REGIME says what the table's data disk is.
disk_name() {
	case $1 in
	disk) echo "the host's disk, cache=none" ;;
	ram) echo "host RAM (CPU-bound)" ;;
	ramcap) echo "host RAM capped by qemu at $RAMCAP_IOPS IOPS (throttling.iops-total)" ;;
	esac
}

declare -A status=()
for d in $disks; do
	for k in "${kernels[@]}"; do
		set +e
		VM_DISK_DIR=$(disk_dir "$d") VM_DISK_OPTS=$(disk_opts "$d") "$VM_DIR/run.sh" --kernel "$k" --disk-size 16G --smp "$smp" --timeout "$timeout" \
			--log "$logdir/bench-scale-$k-$d.log" -- "$guest"
		status[$k-$d]=$?
		set -e
	done
done

failed=0
echo
((noisy)) && echo "==== noisy neighbours ($smp vCPUs): medians of $reps runs of ${runtime}s, fio io_uring direct=1, ublk and loop runs interleaved ====" ||
	echo "==== bench-scale ($smp vCPUs): medians of $reps runs of ${runtime}s, fio io_uring direct=1 4k; volumes at iodepth 4 each, anchor (volumes 1) 2 jobs x iodepth 32 ===="
((noisy)) || echo "     share: of the same design's single device; /loop: of as many kernel loop devices; attach and stage+mkfs: median/worst ms"
for d in $disks; do
	for k in "${kernels[@]}"; do
		log="$logdir/bench-scale-$k-$d.log"
		((status[$k-$d] == 0)) || failed=1
		echo "-- kernel $(cat "$(kernel_dir "$k")/release"), data disk: $(disk_name "$d")$( ((status[$k-$d] == 0)) || echo " (VM run FAILED, exit ${status[$k-$d]})")"
		grep -a -E '^bench-scale: ' "$log" | sed 's/^/  /' | head -20 || true
		((noscale)) || table "$log"
		if ((noisy)); then noisytable "$log"; else lattable "$log"; fi
		grep -a -E '^(PROFILED|PROFILE) ' "$log" | sed 's/^/  /' || true
	done
done
exit "$failed"
