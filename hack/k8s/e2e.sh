#!/usr/bin/env bash
# `make e2e-k8s`: the user's path on a real two-node Kubernetes.
#   1. install.sh: packages, etcd, Kubernetes, helm, sidecars, images, the storage suite (cached),
#   2. the plugin's image (hack/image/build.sh, for this machine's
#      architecture only) tagged as the chart's
#      appVersion, so the chart's default image reference is what runs,
#   3. cluster.sh up, 4. the Go tests in test/k8s, 5. the quick subset of
#      Kubernetes' external storage suite on the same cluster
#      (conformance.sh quick), 6. cluster.sh down with its leak check (also
#      on failure or interrupt), 7. a summary with the time of each phase.
# E2E_K8S_RUN passes a -run pattern to go test; E2E_K8S_KEEP=1 leaves the
# cluster up after the tests (tear it down with hack/k8s/cluster.sh down);
# E2E_K8S_CONFORMANCE=1 (make e2e-k8s-conformance) runs the whole suite in
# step 5 instead (conformance.sh whole); E2E_K8S_SUITE=0 leaves step 5 out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"
cd "$ROOT"

phases=()
# phase NAME CMD...: runs CMD and records its duration and result.
phase() {
	local name=$1 start rc=0
	shift
	start=$SECONDS
	log "== $name"
	"$@" || rc=$?
	phases+=("$(printf '%-14s %5ss  %s' "$name" $((SECONDS - start)) "$([[ $rc == 0 ]] && echo ok || echo "FAILED ($rc)")")")
	return "$rc"
}

summary() {
	echo
	echo "e2e-k8s summary (Kubernetes $KUBE_VERSION, two nodes):"
	printf '  %s\n' "${phases[@]}"
	[[ ! -s $K8S_WORK/logs/go-test.summary ]] || sed 's/^/    /' "$K8S_WORK/logs/go-test.summary"
	echo "  logs: $K8S_WORK/logs"
}

plugin_image() {
	local tag
	tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/csi-fastblk/Chart.yaml)
	mkdir -p "$K8S_WORK"
	# The nodes import their own platform's image only (node.sh), so the
	# archive holds that one (make image and chart-test build every arch).
	ARCHES=$(go env GOARCH) IMAGE_TAG=$tag OUT="$K8S_WORK/csi-fastblk.oci.tar" hack/image/build.sh >"$K8S_WORK/plugin-image.log" 2>&1 ||
		{ cat "$K8S_WORK/plugin-image.log"; return 1; }
	{
		echo "ghcr.io/fastblk/csi-fastblk:$tag $K8S_WORK/csi-fastblk.oci.tar"
		cat "$K8S_CACHE"/images/*.ref
	} >"$K8S_WORK/images.list"
}

tests() {
	local rc=0 log=$K8S_WORK/logs/go-test.log
	go test -c -o "$K8S_WORK/k8s.test" ./test/k8s/
	(cd test/k8s && FASTBLK_K8S=$ROOT/hack/k8s/cluster.sh K8S_WORK=$K8S_WORK FASTBLK_PROMTOOL=$K8S_BIN/promtool \
		"$K8S_WORK/k8s.test" -test.v -test.timeout 40m ${E2E_K8S_RUN:+-test.run "$E2E_K8S_RUN"}) >"$log" 2>&1 || rc=$?
	grep -E '^\s*--- (PASS|FAIL|SKIP)' "$log" >"$K8S_WORK/logs/go-test.summary" || true
	((rc == 0)) || grep -E '^\s+\S+_test.go:[0-9]+:' "$log" | tail -n 40 >&2 || true
	return "$rc"
}

teardown() {
	[[ ${E2E_K8S_KEEP:-} == 1 ]] && { log "E2E_K8S_KEEP=1: cluster left up"; return 0; }
	phase teardown hack/k8s/cluster.sh down || rc=1
}

rc=0
[[ ! -e $K8S_WORK/pids ]] || hack/k8s/cluster.sh down
trap 'teardown; summary; exit $rc' EXIT
trap 'rc=130; exit' INT TERM
phase install hack/k8s/install.sh || { rc=1; exit; }
phase plugin-image plugin_image || { rc=1; exit; }
phase cluster-up hack/k8s/cluster.sh up || { rc=1; exit; }
phase tests tests || rc=1
suite=quick dir=conformance-quick
[[ ${E2E_K8S_CONFORMANCE:-} != 1 ]] || suite=whole dir=conformance
if [[ ${E2E_K8S_SUITE:-1} != 0 || $suite == whole ]]; then
	phase "suite-$suite" hack/k8s/conformance.sh "$suite" || rc=1
	[[ ! -s $K8S_WORK/logs/$dir/summary ]] ||
		sed "1s/^/storage suite ($suite): /" "$K8S_WORK/logs/$dir/summary" >>"$K8S_WORK/logs/go-test.summary"
fi
