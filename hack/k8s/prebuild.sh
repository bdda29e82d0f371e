#!/usr/bin/env bash
# prebuild.sh start|stop: make test builds the two-node cluster's Go
# programs (install.sh kube sidecars e2e: Kubernetes, the CSI sidecars, the
# storage suite; about 40 CPU-minutes on a machine with no cache) in the
# background while its other phases run, at idle CPU priority (SCHED_IDLE
# and nice 19), so that it takes only the CPU the tests leave idle and
# e2e-k8s, last, finds it done or waits for the rest (install.sh's lock).
# Only Go builds run here: the apt steps stay in the foreground, where no
# other apt runs beside them.
#   start  starts it and returns at once (with a warm cache it ends in seconds)
#   stop   ends it if it still runs (make test failed before e2e-k8s) and
#          prints the CPU seconds it used (hack/cpu.sh), for make test's log
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"
# shellcheck source=hack/cpu.sh
. "$ROOT/hack/cpu.sh"
# The prebuild's cpuacct group (cpu_group), for stop's CPU figure.
PREBUILD_CGROUP="$K8S_CACHE/prebuild.cgroup"

# running: the pid file names a live process group.
running() {
	[[ -s $PREBUILD_PID ]] && kill -0 -- "-$(cat "$PREBUILD_PID")" 2>/dev/null
}

case ${1:-} in
start)
	mkdir -p "$K8S_CACHE"
	running && { log "prebuild: already running (log $PREBUILD_LOG)"; exit 0; }
	command -v chrt >/dev/null || die "prebuild: chrt (util-linux) missing"
	cg=$(cpu_group prebuild)
	echo "$cg" >"$PREBUILD_CGROUP"
	(cpu_join "$cg" && exec setsid chrt --idle 0 nice -n 19 "$ROOT/hack/k8s/install.sh" kube sidecars e2e) \
		>"$PREBUILD_LOG" 2>&1 </dev/null &
	echo $! >"$PREBUILD_PID"
	log "prebuild: building Kubernetes, the sidecars and the storage suite at idle priority (pid $!, log $PREBUILD_LOG)"
	;;
stop)
	if running; then
		log "prebuild: stopping it (pid $(cat "$PREBUILD_PID"))"
		kill -TERM -- "-$(cat "$PREBUILD_PID")" 2>/dev/null || true
	fi
	rm -f "$PREBUILD_PID"
	cg=$(cat "$PREBUILD_CGROUP" 2>/dev/null || true)
	if [[ -n $cg && -d $cg ]]; then
		log "prebuild: $(cpu_seconds "$cg") CPU s"
		cpu_release "$cg"
	fi
	rm -f "$PREBUILD_CGROUP"
	;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
