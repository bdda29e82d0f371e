#!/bin/sh
# bench-scale.sh (guest side of hack/vm/bench-scale.sh): many volumes busy at
# once. For each volume count, csi-fastblk volumes created, staged and
# published over CSI (block mode) with the plugin's shared server threads
# ("shared"), the same with a thread per queue ("perqueue", the design before
# them, when BENCH_SCALE_COMPARE=1), and as many kernel loop devices with
# direct I/O ("loop"), each on files of the same size on /data; fio 4k random
# at a small depth on every device at once. The anchor is one device at
# BENCH_SCALE_ANCHOR (jobs x depth). Prints one line per run:
#   SCALE <rep> <label> mode=... volumes=N rw=... iops=... [plugin figures]
#
# Environment: BENCH_SCALE_VOLUMES (default "1 16 64"), BENCH_SCALE_RW
# (default "randread randwrite"), BENCH_SCALE_DEPTH (per volume, default 4),
# BENCH_SCALE_ANCHOR (default "2x32"), BENCH_RUNTIME (default 10),
# BENCH_REPS (default 3), BENCH_SCALE_SIZE (default 64Mi),
# BENCH_SCALE_COMPARE (1: also the thread-per-queue design).
. /opt/fastblk/vm/lib.sh
VOLUMES=${BENCH_SCALE_VOLUMES:-"1 16 64"}
RWS=${BENCH_SCALE_RW:-"randread randwrite"}
DEPTH=${BENCH_SCALE_DEPTH:-4}
ANCHOR=${BENCH_SCALE_ANCHOR:-2x32}
RUNTIME=${BENCH_RUNTIME:-10}
REPS=${BENCH_REPS:-3}
SIZE=${BENCH_SCALE_SIZE:-64Mi}
BIN=/usr/bin/csi-fastblk
SOCK=/tmp/fastblk-scale.sock
PLUGIN_PID=""

stop_plugin() {
	[ -z "$PLUGIN_PID" ] && return 0
	kill -TERM "$PLUGIN_PID" 2>/dev/null
	wait "$PLUGIN_PID" 2>/dev/null
	PLUGIN_PID=""
}
trap stop_plugin EXIT

# start_plugin LABEL ARGS starts csi-fastblk serve with ARGS on a fresh data
# directory and waits for its socket.
start_plugin() {
	rm -rf "$FASTBLK_DATA/scale-$1" "$SOCK"
	mkdir -p "$FASTBLK_DATA/scale-$1"
	# shellcheck disable=SC2086
	$BIN serve --endpoint "unix://$SOCK" --node-id bench --data-dir "$FASTBLK_DATA/scale-$1/data" --backend ublk \
		--dev-dir "/tmp/scale-dev-$1" --metrics-address 127.0.0.1:0 --max-volumes-per-node 256 $2 \
		>"/tmp/scale-$1.log" 2>&1 &
	PLUGIN_PID=$!
	i=0
	while [ ! -S "$SOCK" ] && [ $i -lt 300 ]; do
		kill -0 "$PLUGIN_PID" 2>/dev/null || break
		sleep 0.1
		i=$((i + 1))
	done
	[ -S "$SOCK" ] || { echo "bench-scale: plugin $1 did not start:"; cat "/tmp/scale-$1.log"; return 1; }
}

# run REP LABEL ARGS: one bench scale run, its SCALE line prefixed with REP
# and LABEL (a failed run prints a SCALE line with iops=-).
run() {
	_rep=$1 _label=$2
	shift 2
	if out=$($BIN bench scale --runtime "$RUNTIME" --size "$SIZE" --dir "$FASTBLK_DATA/scale-work" "$@" 2>&1); then
		echo "$out" | sed -n "s/^SCALE /SCALE $_rep $_label /p"
	else
		echo "bench-scale: $_label $*: $out"
		echo "SCALE $_rep $_label failed iops=-"
	fi
}

labels="shared"
[ "${BENCH_SCALE_COMPARE:-0}" = 1 ] && labels="shared perqueue"
jobs=${ANCHOR%x*} adepth=${ANCHOR#*x}
rep=1
while [ $rep -le "$REPS" ]; do
	for label in $labels loop; do
		case $label in
		shared) start_plugin shared "" || exit 1 ;;
		perqueue) start_plugin perqueue "--ublk-thread-per-queue" || exit 1 ;;
		esac
		mode=csi
		[ $label = loop ] && mode=loop
		for rw in $RWS; do
			run $rep $label --mode $mode --pid "${PLUGIN_PID:-0}" --endpoint "unix://$SOCK" --volumes 1 --rw "$rw" \
				--jobs "$jobs" --iodepth "$adepth" --mkfs-sample 0
			for n in $VOLUMES; do
				[ "$n" = 1 ] && continue
				sample=0
				[ "$rw" = randread ] && sample=4
				run $rep $label --mode $mode --pid "${PLUGIN_PID:-0}" --endpoint "unix://$SOCK" --volumes "$n" --rw "$rw" \
					--iodepth "$DEPTH" --mkfs-sample $sample
			done
		done
		stop_plugin
		left=$(ublk_devices)
		[ -z "$left" ] || echo "bench-scale: ublk devices left behind by $label: $left"
	done
	rep=$((rep + 1))
done
