#!/usr/bin/env bash
# Kubernetes' external storage e2e tests against csi-fastblk on the running
# cluster of cluster.sh (chart installed, as test/k8s leaves it):
#   e2e.test -storage.testdriver=test/k8s/conformance/driver.yaml
# run in the control plane's network namespace, where the API server
# listens. CONFORMANCE_FOCUS / CONFORMANCE_SKIP are ginkgo regular
# expressions (default: every External.Storage test of the driver, minus
# the disruptive and serial ones). Reports go to $K8S_WORK/logs/conformance.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"

focus=${CONFORMANCE_FOCUS:-'External.Storage \[Driver: fastblk.csi.io\]'}
skip=${CONFORMANCE_SKIP:-'\[Disruptive\]|\[Serial\]|\[Feature:VolumeSnapshotDataSource\].*\[Slow\]'}
[[ -x $K8S_BIN/e2e.test ]] || die "$K8S_BIN/e2e.test missing: run hack/k8s/install.sh e2e"
[[ -e /run/netns/fbk-k8s-cp ]] || die "no cluster: run hack/k8s/cluster.sh up"
out=$K8S_WORK/logs/conformance
mkdir -p "$out"
log "e2e.test: focus '$focus', skip '$skip'"
rc=0
nsenter --net=/run/netns/fbk-k8s-cp -- "$K8S_BIN/e2e.test" \
	-kubeconfig="$K8S_WORK/admin.kubeconfig" -kubectl-path="$K8S_BIN/kubectl" \
	-storage.testdriver="$ROOT/test/k8s/conformance/driver.yaml" -repo-root="$ROOT" \
	-report-dir="$out" -ginkgo.focus="$focus" -ginkgo.skip="$skip" \
	-ginkgo.timeout=2h -ginkgo.no-color -ginkgo.succinct >"$out/e2e.log" 2>&1 || rc=$?
grep -E '^(Ran [0-9]+ of|SUCCESS|FAIL!|  \[FAIL\]|\[FAIL\])' "$out/e2e.log" >&2 || true
log "e2e.test exit $rc; log $out/e2e.log, JUnit report in $out"
exit "$rc"
