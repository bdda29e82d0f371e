#!/bin/sh
# bench-scale.sh (guest side of hack/vm/bench-scale.sh): many volumes busy at
# once. For each volume count, csi-fastblk volumes created, staged and
# published over CSI (block mode) with the plugin's default server threads
# ("ours"), and as many kernel loop devices with direct I/O ("loop"), each
# on files of the same size on /data; fio 4k random at a small depth on every
# device at once. The anchor is one device at
# BENCH_SCALE_ANCHOR (jobs x depth). Prints one line per run:
#   SCALE <rep> <label> mode=... volumes=N rw=... iops=... [plugin figures]
#
# Environment: BENCH_SCALE_VOLUMES (default "1 16 64"), BENCH_SCALE_RW
# (default "randread randwrite"), BENCH_SCALE_DEPTH (per volume, default 4),
# BENCH_SCALE_ANCHOR (default "2x32"), BENCH_RUNTIME (default 10),
# BENCH_REPS (default 3), BENCH_SCALE_SIZE (default 64Mi),
# BENCH_SCALE_VARIANTS (plugin set-ups to measure instead: space-separated
# LABEL or LABEL=FLAGS, FLAGS being serve flags (or NAME=VALUE for its
# environment, or params=K=V,K=V for the StorageClass parameters of the
# volumes) joined by '+', e.g. "ours shared=--ublk-thread-policy=shared
# each=--ublk-ablate=submit-each q1=params=queues=1,queueDepth=64"),
# BENCH_SCALE_LOOP (0: leave out the kernel loop devices), BENCH_SCALE_REF
# (1: also the reference ublk server in /opt/ref, "ref", see
# hack/vm/bench-scale.sh --reference),
# BENCH_SCALE_LAT (1: also the latency probe: one device at iodepth 1 alone
# and with BENCH_SCALE_LAT_BUSY others at iodepth DEPTH, default 15, its
# p50/p99/p99.9 printed as LAT lines; with loop, the backing files
# themselves ("file", direct I/O) are measured too), BENCH_SCALE_NOSCALE
# (1: only the latency probe), BENCH_SCALE_PROFILE (1: in the first rep,
# each csi-fastblk workload, or the noisy-neighbour probe, once more under
# /usr/bin/perf, see profile),
# BENCH_SCALE_NOISY (1: only the noisy-neighbour probe: one device at 4k
# randread iodepth 1 alone and beside BENCH_SCALE_LAT_BUSY others at 4k
# randwrite iodepth 32; "file" runs fio on the backing files themselves, the
# data disk's own figures).
. /opt/fastblk/vm/lib.sh
VOLUMES=${BENCH_SCALE_VOLUMES:-"1 16 64"}
RWS=${BENCH_SCALE_RW:-"randread randwrite"}
DEPTH=${BENCH_SCALE_DEPTH:-4}
ANCHOR=${BENCH_SCALE_ANCHOR:-2x32}
RUNTIME=${BENCH_RUNTIME:-10}
REPS=${BENCH_REPS:-3}
SIZE=${BENCH_SCALE_SIZE:-64Mi}
PROBE_RW=""
if [ "${BENCH_SCALE_NOISY:-0}" = 1 ]; then
	BENCH_SCALE_LAT=1 BENCH_SCALE_NOSCALE=1 RWS=randwrite DEPTH=32 PROBE_RW=randread
fi
BIN=/usr/bin/csi-fastblk
SOCK=/tmp/fastblk-scale.sock
PLUGIN_PID=""
# The plugin's metrics, which the noisy-neighbour probe reads for the quiet
# volume's latency inside the server.
METRICS_ADDR=127.0.0.1:9811

stop_plugin() {
	[ -z "$PLUGIN_PID" ] && return 0
	kill -TERM "$PLUGIN_PID" 2>/dev/null
	wait "$PLUGIN_PID" 2>/dev/null
	PLUGIN_PID=""
}
trap stop_plugin EXIT

# start_plugin LABEL ARGS starts csi-fastblk serve with ARGS on a fresh data
# directory and waits for its socket. Words of ARGS of the form NAME=VALUE
# (not flags) go to its environment (GOMAXPROCS=4).
start_plugin() {
	rm -rf "$FASTBLK_DATA/scale-$1" "$SOCK"
	mkdir -p "$FASTBLK_DATA/scale-$1"
	_env="" _flags=""
	for w in $2; do
		case $w in
		params=*) ;; # the volumes', not the plugin's (run)
		-*) _flags="$_flags $w" ;;
		*=*) _env="$_env $w" ;;
		*) _flags="$_flags $w" ;;
		esac
	done
	# shellcheck disable=SC2086
	env $_env $BIN serve --endpoint "unix://$SOCK" --node-id bench --data-dir "$FASTBLK_DATA/scale-$1/data" --backend ublk \
		--dev-dir "/tmp/scale-dev-$1" --metrics-address "$METRICS_ADDR" --max-volumes-per-node 256 $_flags \
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
	[ -z "$PARAMS" ] || set -- "$@" --params "$PARAMS"
	[ "$_label" != ref ] || set -- "$@" --ref-ublk /opt/ref/ublk
	if out=$($BIN bench scale --runtime "$RUNTIME" --size "$SIZE" --dir "$FASTBLK_DATA/scale-work" "$@" 2>&1); then
		echo "$out" | sed -n -e "s/^SCALE /SCALE $_rep $_label /p" -e "s/^LAT /LAT $_rep $_label /p" -e "s/^bench scale: /bench-scale: $_label: /p"
	else
		echo "bench-scale: $_label $*: $out"
		echo "SCALE $_rep $_label failed iops=-"
	fi
}

# profile LABEL ARGS: one bench scale run of a csi-fastblk design under perf
# (the whole guest; cpu-clock, as the VM has no PMU; call graphs), then its
# SCALE line as PROFILED and the report's top entries as PROFILE lines: by
# command and DSO, by symbol (self), the plugin's symbols (self, the share
# of all samples), and by symbol with callees (children).
profile() {
	_label=$1
	shift
	[ -z "$PARAMS" ] || set -- "$@" --params "$PARAMS"
	_what="$_label $(echo "$*" | sed -n 's/.*--volumes \([0-9]*\) --rw \([a-z]*\).*/v\1 \2/p')"
	if ! /usr/bin/perf record -q -a -g -e cpu-clock -F 499 -o /tmp/perf.data -- \
		$BIN bench scale --runtime "$RUNTIME" --size "$SIZE" --dir "$FASTBLK_DATA/scale-work" "$@" >/tmp/perf-run.out 2>&1; then
		echo "bench-scale: profile $_what: $(tail -5 /tmp/perf-run.out)"
		return 0
	fi
	sed -n -e "s/^SCALE /PROFILED $_what /p" -e "s/^LAT /PROFILED $_what /p" /tmp/perf-run.out
	for _view in "dso:--no-children --sort comm,dso --percent-limit 1.5" "self:--no-children --sort sym --percent-limit 0.7" \
		"plugin:--no-children --comms csi-fastblk --sort sym --percent-limit 1" "children:--children --sort sym --percent-limit 8"; do
		# shellcheck disable=SC2086
		/usr/bin/perf report -i /tmp/perf.data --stdio -g none ${_view#*:} 2>/dev/null | grep -v -e '^#' -e '^ *$' |
			sed "s/^ */PROFILE $_what ${_view%%:*} /"
	done
	rm -f /tmp/perf.data
}

variants=${BENCH_SCALE_VARIANTS:-ours}
labels=""
for v in $variants; do labels="$labels ${v%%=*}"; done
[ "${BENCH_SCALE_REF:-0}" = 1 ] && labels="$labels ref"
[ "${BENCH_SCALE_LOOP:-1}" = 1 ] && labels="$labels loop"
[ "${BENCH_SCALE_LOOP:-1}" = 1 ] && [ "${BENCH_SCALE_LAT:-0}" = 1 ] && labels="$labels file"
LAT_BUSY=${BENCH_SCALE_LAT_BUSY:-15}

# flags_of LABEL prints the serve flags of a variant.
flags_of() {
	case $1 in
	ours) return 0 ;;
	esac
	for v in $variants; do
		[ "${v%%=*}" = "$1" ] && [ "$v" != "$1" ] && echo "${v#*=}" | tr '+' ' '
	done
}
jobs=${ANCHOR%x*} adepth=${ANCHOR#*x}
rep=1
while [ $rep -le "$REPS" ]; do
	for label in $labels; do
		mode=csi PARAMS=""
		case $label in
		loop | file | ref) mode=$label ;;
		*)
			start_plugin "$label" "$(flags_of "$label")" || exit 1
			PARAMS=$(flags_of "$label" | tr ' ' '\n' | sed -n 's/^params=//p')
			;;
		esac
		if [ "${BENCH_SCALE_LAT:-0}" = 1 ]; then
			for rw in $RWS; do
				for n in 1 $((LAT_BUSY + 1)); do
					run $rep $label --mode $mode --pid "${PLUGIN_PID:-0}" --endpoint "unix://$SOCK" --volumes "$n" --rw "$rw" \
						--iodepth "$DEPTH" --mkfs-sample 0 --lat-probe ${PROBE_RW:+--probe-rw "$PROBE_RW" --metrics "http://$METRICS_ADDR/metrics"}
				done
			done
		fi
		for rw in $RWS; do
			[ "${BENCH_SCALE_NOSCALE:-0}" = 1 ] || [ $label = file ] && break
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
		if [ "${BENCH_SCALE_PROFILE:-0}" = 1 ] && [ $rep = 1 ] && [ $mode = csi ] && [ -n "$PROBE_RW" ]; then
			# The noisy-neighbour probe itself: the quiet volume beside
			# the busy ones.
			profile $label --mode csi --pid "$PLUGIN_PID" --endpoint "unix://$SOCK" --volumes $((LAT_BUSY + 1)) --rw "$RWS" \
				--iodepth "$DEPTH" --mkfs-sample 0 --lat-probe --probe-rw "$PROBE_RW" --metrics "http://$METRICS_ADDR/metrics"
		elif [ "${BENCH_SCALE_PROFILE:-0}" = 1 ] && [ $rep = 1 ] && [ $mode = csi ]; then
			for rw in $RWS; do
				profile $label --mode csi --pid "$PLUGIN_PID" --endpoint "unix://$SOCK" --volumes 1 --rw "$rw" \
					--jobs "$jobs" --iodepth "$adepth" --mkfs-sample 0
				for n in $VOLUMES; do
					[ "$n" = 1 ] && continue
					profile $label --mode csi --pid "$PLUGIN_PID" --endpoint "unix://$SOCK" --volumes "$n" --rw "$rw" \
						--iodepth "$DEPTH" --mkfs-sample 0
				done
			done
		fi
		stop_plugin
		left=$(ublk_devices)
		[ -z "$left" ] || echo "bench-scale: ublk devices left behind by $label: $left"
	done
	rep=$((rep + 1))
done
