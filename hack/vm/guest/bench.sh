#!/bin/sh
# bench.sh (guest side of hack/vm/bench.sh): fio through a csi-fastblk ublk
# device and through the kernel loop device with direct I/O, both on the same
# fully written backing file on /data, repetitions alternating the two. Prints
# one line per run for the host to tabulate:
#   BENCH <workload> <ublk|ublk2|loop> <rep> <value> <unit>
# and after each run on a ublk device what its server's io-wq did:
#   IOWQ <workload> <device> <rep> workers N iowq_cpu_s S server_cpu_s S
# Workloads: randread/randwrite 4k at iodepth 32 with 1 and 2 jobs (IOPS),
# 1M sequential read/write (MiB/s), 4k randread and randwrite at iodepth 1
# (mean latency, us).
#
# Environment: BENCH_SIZE (backing file, default 2G), BENCH_RUNTIME (seconds per
# run, default 10), BENCH_REPS (default 3), BENCH_SEQ_DEPTH (default 16),
# BENCH_UBLK_ARGS (extra args for csi-fastblk ublk serve, e.g. "--zero-copy off"),
# BENCH_UBLK2_ARGS (a second ublk device, "ublk2", served with these args on
# top, measured in the same rotation: an A/B comparison of server options),
# BENCH_ONLY (space-separated workload names to run), BENCH_SPARSE=1 (the
# backing file is not written first, and every hole is punched again before
# each write run, so the writes allocate: the worst case of a fresh volume),
# BENCH_PREALLOC (with BENCH_SPARSE=1: space-separated preallocation modes,
# each measured as devices "ublk+MODE" and "loop+MODE" beside the sparse ones,
# the file made fresh again before each write run: "falloc" allocates it with
# fallocate mode 0 as the StorageClass parameter preallocation=falloc does,
# unwritten extents; "zero" writes zeros over it, written extents, as
# preallocation=full leaves it), BENCH_PROFILE=1 (after the repetitions, one
# more run of each workload on each device under perf: the whole guest,
# cpu-clock, call graphs; its figure as a PROFILED line and the report's top
# entries as PROFILE lines, see profile).
. /opt/fastblk/vm/lib.sh
SIZE=${BENCH_SIZE:-2G}
RUNTIME=${BENCH_RUNTIME:-10}
REPS=${BENCH_REPS:-3}
SEQ_DEPTH=${BENCH_SEQ_DEPTH:-16}
FILE=$FASTBLK_DATA/bench.img
FIO=/usr/bin/fio
WORKLOADS=${BENCH_ONLY:-"randread-qd32-j1 randread-qd32-j2 randwrite-qd32-j1 randwrite-qd32-j2 read-1m write-1m randread-qd1-lat randwrite-qd1-lat"}
UBLK_DEV="" UBLK_PID="" UBLK2_DEV="" UBLK2_PID="" LOOP_DEV=""

cleanup() {
	# The servers print their queues' counters when they stop.
	[ -z "$UBLK_PID" ] || { kill -TERM "$UBLK_PID" 2>/dev/null; wait "$UBLK_PID"; sed -n 's/^queue/bench: ublk queue/p' /tmp/UBLK-serve.log; }
	[ -z "$UBLK2_PID" ] || { kill -TERM "$UBLK2_PID" 2>/dev/null; wait "$UBLK2_PID"; sed -n 's/^queue/bench: ublk2 queue/p' /tmp/UBLK2-serve.log; }
	[ -z "$LOOP_DEV" ] || /usr/sbin/losetup -d "$LOOP_DEV"
}
trap cleanup EXIT

# fill writes every block of the backing file, so reads hit real blocks.
fill() {
	echo "bench: writing $SIZE backing file $FILE"
	$FIO --name=fill --filename="$FILE" --size="$SIZE" --rw=write --bs=1M --direct=1 \
		--ioengine=io_uring --iodepth=8 --output-format=terse >/dev/null || return 1
	sync
}

start_loop() {
	LOOP_DEV=$(/usr/sbin/losetup --direct-io=on --find --show "$FILE") || return 1
	dio=$(cat "/sys/block/${LOOP_DEV#/dev/}/loop/dio" 2>/dev/null)
	echo "bench: loop device $LOOP_DEV (dio=$dio)"
	[ "$dio" = 1 ] || { echo "bench: loop device without direct I/O"; return 1; }
}

# start_ublk NAME ARGS runs csi-fastblk ublk serve with ARGS (on top of
# BENCH_UBLK_ARGS) and waits for its device line; it sets <NAME>_DEV and
# <NAME>_PID.
start_ublk() {
	if ! /usr/bin/csi-fastblk ublk serve --help 2>&1 | grep -q -- -file; then
		echo "bench: csi-fastblk ublk serve not available; loop device only"
		return 1
	fi
	_log=/tmp/$1-serve.log
	# shellcheck disable=SC2086
	/usr/bin/csi-fastblk ublk serve --file "$FILE" $BENCH_UBLK_ARGS $2 >"$_log" 2>&1 &
	_pid=$!
	eval "$1_PID=$_pid"
	_dev="" i=0
	while [ $i -lt 300 ]; do
		_dev=$(sed -n 's/^device \(\/dev\/ublkb[0-9]*\).*/\1/p' "$_log")
		[ -n "$_dev" ] && break
		kill -0 "$_pid" 2>/dev/null || break
		sleep 0.1
		i=$((i + 1))
	done
	if [ -z "$_dev" ]; then
		echo "bench: ublk serve $2 gave no device:"
		cat "$_log"
		eval "$1_PID="
		return 1
	fi
	eval "$1_DEV=$_dev"
	echo "bench: $(echo "$1" | tr 'A-Z' 'a-z') device $_dev${2:+ ($2)}: $(grep '^tuning' "$_log")"
}

# live DEV checks that DEV is a block device that answers a direct read, and,
# for the ublk device, that its server still runs.
live() {
	require_block "$1" || return 1
	if [ "$1" = "$UBLK_DEV" ] && ! kill -0 "$UBLK_PID" 2>/dev/null; then
		echo "bench: ublk server exited"
		return 1
	fi
	if [ "$1" = "$UBLK2_DEV" ] && ! kill -0 "$UBLK2_PID" 2>/dev/null; then
		echo "bench: second ublk server exited"
		return 1
	fi
}

# run_fio WORKLOAD DEV prints the workload's figure for DEV and its unit.
run_fio() {
	case "$1" in
	randread-qd32-j1) rw=randread bs=4k qd=32 nj=1 ;;
	randread-qd32-j2) rw=randread bs=4k qd=32 nj=2 ;;
	randwrite-qd32-j1) rw=randwrite bs=4k qd=32 nj=1 ;;
	randwrite-qd32-j2) rw=randwrite bs=4k qd=32 nj=2 ;;
	read-1m) rw=read bs=1M qd=$SEQ_DEPTH nj=1 ;;
	write-1m) rw=write bs=1M qd=$SEQ_DEPTH nj=1 ;;
	randread-qd1-lat) rw=randread bs=4k qd=1 nj=1 ;;
	randwrite-qd1-lat) rw=randwrite bs=4k qd=1 nj=1 ;;
	*) echo "bench: unknown workload $1" >&2; return 1 ;;
	esac
	# Terse v3 fields: read bw 7 (KiB/s), iops 8, lat mean 40 (us); write bw 48, iops 49, lat mean 81.
	$FIO --name=b --filename="$2" --direct=1 --ioengine=io_uring --time_based \
		--runtime="$RUNTIME" --ramp_time=2 --group_reporting --randrepeat=0 \
		--rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" \
		--output-format=terse --terse-version=3 | awk -F';' -v rw="$rw" -v qd="$qd" '
		NF > 90 { r_bw = $7; r_iops = $8; r_lat = $40; w_bw = $48; w_iops = $49; w_lat = $81; ok = 1 }
		END {
			if (!ok) exit 1
			if (rw == "randread" && qd == 1) printf "%.1f us\n", r_lat
			else if (rw == "randwrite" && qd == 1) printf "%.1f us\n", w_lat
			else if (rw == "randread") printf "%d IOPS\n", r_iops
			else if (rw == "randwrite") printf "%d IOPS\n", w_iops
			else if (rw == "read") printf "%.0f MiB/s\n", r_bw / 1024
			else printf "%.0f MiB/s\n", w_bw / 1024
		}'
}

# tasks PID prints one line per thread of PID: its tid, comm and CPU ticks
# (user + system).
tasks() {
	awk '{ t = FILENAME; sub(/\/stat$/, "", t); sub(/^.*\//, "", t); c = $0; sub(/^[^(]*\(/, "", c); sub(/\).*$/, "", c)
		s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print t, c, f[12] + f[13] }' /proc/"$1"/task/*/stat 2>/dev/null
}

# iowq_watch PID samples PID's threads every second into /tmp/iowq.samples
# until killed; iowq_report WL DEV REP prints what the server's io-wq did
# during the run as an IOWQ line: the most io-wq workers (iou-wrk threads)
# alive at once, the CPU seconds they and the server's other threads took.
# The sampling costs the guest an awk and a sed a second, in ublk runs only.
iowq_watch() {
	: >/tmp/iowq.samples
	_n=0
	while :; do
		tasks "$1" | sed "s/^/$_n /" >>/tmp/iowq.samples
		_n=$((_n + 1))
		sleep 1
	done
}
iowq_report() {
	awk -v wl="$1" -v dev="$2" -v rep="$3" '
		FILENAME ~ /start/ { start[$1] = $3; next }
		{
			tid = $2; ticks[tid] = $4; iowq[tid] = ($3 ~ /^iou-wrk/)
			if ($3 ~ /^iou-wrk/) alive[$1]++
		}
		END {
			for (s in alive) if (alive[s] > most) most = alive[s]
			for (tid in ticks) {
				d = ticks[tid] - (tid in start ? start[tid] : 0)
				if (iowq[tid]) w += d; else o += d
			}
			printf "IOWQ %s %s %s workers %d iowq_cpu_s %.2f server_cpu_s %.2f\n", wl, dev, rep, most, w / 100, o / 100
		}' /tmp/iowq.start /tmp/iowq.samples
}

# sparse leaves the backing file all holes, for BENCH_SPARSE=1.
sparse() {
	truncate -s "$SIZE" "$FILE" || return 1
	/usr/bin/fallocate --punch-hole --offset 0 --length "$(stat -c %s "$FILE")" "$FILE" || return 1
	echo "bench: sparse backing file $FILE: $(du -k "$FILE" | cut -f1) KiB allocated of $SIZE"
}

# prealloc MODE makes the backing file fresh for a write run: all holes
# (sparse), then allocated as MODE says (see BENCH_PREALLOC).
prealloc() {
	sparse >/dev/null || return 1
	case "$1" in
	"") ;;
	falloc) /usr/bin/fallocate --length "$(stat -c %s "$FILE")" "$FILE" ;;
	zero) $FIO --name=zero --filename="$FILE" --size="$(stat -c %s "$FILE")" --rw=write --bs=1M --direct=1 \
		--ioengine=io_uring --iodepth=8 --zero_buffers --output-format=terse >/dev/null ;;
	*) echo "bench: unknown preallocation mode $1" >&2; return 1 ;;
	esac
}

# profile WORKLOAD DEVICE-NAME DEV runs the workload once on DEV under perf
# (the whole guest; cpu-clock, as the VM has no PMU; call graphs) and prints
# its figure as a PROFILED line and the report as PROFILE lines: the sample
# count, by command and DSO, by command (every io-wq worker is one), by
# symbol (self), and by symbol with callees (children).
profile() {
	# perf samples the run's measured window (after fio's 2 s ramp).
	(sleep 2 && exec /usr/bin/perf record -q -a -g -e cpu-clock -F 499 -o /tmp/perf.data -- sleep "$RUNTIME" 2>/tmp/perf.err) &
	_perf=$!
	v=$(run_fio "$1" "$3") || v="FAIL -"
	if ! wait $_perf; then
		echo "bench: profile $1 $2: $(tail -3 /tmp/perf.err)"
		return 0
	fi
	echo "PROFILED $1 $2 $v"
	echo "PROFILE $1 $2 samples $(/usr/bin/perf report -i /tmp/perf.data --stdio 2>/dev/null | sed -n 's/^# Samples: \([^ ]*\).*/\1/p' | head -n1)"
	for _view in "dso:--no-children --sort comm,dso --percent-limit 1" "comm:--no-children --sort comm --percent-limit 0.3" "self:--no-children --sort sym --percent-limit 0.7" \
		"children:--children --sort sym --percent-limit 5"; do
		# shellcheck disable=SC2086
		/usr/bin/perf report -i /tmp/perf.data --stdio -g none ${_view#*:} 2>/dev/null | grep -v -e '^#' -e '^ *$' |
			sed "s/^ */PROFILE $1 $2 ${_view%%:*} /"
	done
	rm -f /tmp/perf.data
}

main() {
	if [ "${BENCH_SPARSE:-0}" = 1 ]; then
		sparse || { echo "bench: sparse file failed"; exit 1; }
	else
		fill || { echo "bench: fill failed"; exit 1; }
	fi
	start_loop || exit 1
	devs="loop"
	start_ublk UBLK "" && devs="ublk loop"
	if [ -n "$BENCH_UBLK2_ARGS" ] && [ -n "$UBLK_DEV" ]; then
		start_ublk UBLK2 "$BENCH_UBLK2_ARGS" || exit 1
		devs="ublk ublk2 loop"
	fi
	if [ "${BENCH_SPARSE:-0}" = 1 ]; then
		for m in ${BENCH_PREALLOC:-}; do
			[ -z "$UBLK_DEV" ] || devs="$devs ublk+$m"
			devs="$devs loop+$m"
		done
		for m in ${BENCH_PREALLOC:-}; do
			prealloc "$m" || { echo "bench: preallocation mode $m failed"; exit 1; }
			echo "bench: preallocated ($m) backing file $FILE: $(du -k "$FILE" | cut -f1) KiB allocated of $SIZE"
		done
		sparse >/dev/null || exit 1
	fi
	rep=1
	while [ $rep -le "$REPS" ]; do
		# Alternate the order (reversed on even repetitions), so drift
		# hits every device alike.
		order=$devs
		[ $((rep % 2)) -eq 0 ] && order=$(echo "$devs" | awk '{for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "")}')
		for wl in $WORKLOADS; do
			for d in $order; do
				case $d in
				ublk | ublk+*) dev=$UBLK_DEV ;;
				ublk2) dev=$UBLK2_DEV ;;
				*) dev=$LOOP_DEV ;;
				esac
				live "$dev" || { echo "BENCH $wl $d $rep FAIL -"; continue; }
				mode=""
				case $d in *+*) mode=${d#*+} ;; esac
				case "${BENCH_SPARSE:-0}:$wl" in
				1:*write*) prealloc "$mode" || { echo "BENCH $wl $d $rep FAIL -"; continue; } ;;
				esac
				pid=""
				case $d in
				ublk | ublk+*) pid=$UBLK_PID ;;
				ublk2) pid=$UBLK2_PID ;;
				esac
				if [ -n "$pid" ]; then
					tasks "$pid" >/tmp/iowq.start
					iowq_watch "$pid" &
					watch=$!
				fi
				v=$(run_fio "$wl" "$dev") || v="FAIL -"
				echo "BENCH $wl $d $rep $v"
				if [ -n "$pid" ]; then
					kill "$watch" 2>/dev/null
					wait "$watch" 2>/dev/null
					iowq_report "$wl" "$d" "$rep"
				fi
			done
		done
		rep=$((rep + 1))
	done
	if [ "${BENCH_PROFILE:-0}" = 1 ]; then
		for wl in $WORKLOADS; do
			for d in $devs; do
				case $d in
				ublk | ublk+*) dev=$UBLK_DEV ;;
				ublk2) dev=$UBLK2_DEV ;;
				*) dev=$LOOP_DEV ;;
				esac
				live "$dev" && profile "$wl" "$d" "$dev"
			done
		done
	fi
	[ -z "$UBLK_PID" ] || kill -0 "$UBLK_PID" || { echo "bench: ublk server died"; exit 1; }
	# The memory one attached volume costs, after every workload ran.
	[ -z "$UBLK_PID" ] || echo "bench: ublk server memory after the runs: $(grep -E '^VmRSS' "/proc/$UBLK_PID/status" | tr -s ' \t' ' ')"
}

main
