#!/usr/bin/env bash
# Kubernetes' external storage e2e tests against csi-fastblk on the running
# cluster of cluster.sh (chart installed, as test/k8s leaves it):
#   storage-e2e.test -storage.testdriver=test/k8s/conformance/driver.yaml
# (install.sh e2e: the storage suites of Kubernetes' e2e tests alone) run in
# the control plane's network namespace, where the API server listens, by
# the ginkgo CLI of the same module (install.sh e2e), which alone can run
# specs in parallel processes.
#
#   conformance.sh [whole]  every spec the driver definition selects, minus
#                           the disruptive and serial ones (make
#                           e2e-k8s-conformance; about 35 minutes here)
#   conformance.sh quick    one spec each of fs and block volumes, snapshot
#                           restore, expansion and capacity (make e2e-k8s,
#                           a few minutes); fails unless each pattern of
#                           $quick selects exactly one spec
#
# CONFORMANCE_FOCUS / CONFORMANCE_SKIP (ginkgo regular expressions) replace
# the focus and skip of either. CONFORMANCE_PROCS specs run at once (whole:
# 4, quick: 1): most of a spec's time is spent waiting for pods and volumes,
# so parallel specs overlap their waits; [Serial] specs, which need the
# cluster to themselves, are skipped in both. Reports go to
# $K8S_WORK/logs/conformance (quick: $K8S_WORK/logs/conformance-quick).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"

driver='External.Storage \[Driver: fastblk.csi.io\]'
# The quick subset, one pattern per spec. Online expansion is the block
# volume's: growing a mounted ext4 (the default fs) needs CAP_SYS_RESOURCE,
# which this machine withholds (docs/k8s-conformance.md).
quick=(
	'\[Testpattern: Dynamic PV \(default fs\)\] volumes should store data'
	'\[Testpattern: Dynamic PV \(block volmode\)\] volumes should store data'
	'\[Testpattern: Dynamic Snapshot \(delete policy\)\] snapshottable .* check restore correctly works after modifying source data'
	'\[Testpattern: Dynamic PV \(block volmode\)\(allowExpansion\)\] volume-expand should resize volume when PVC is edited while pod is using it'
	'\[Testpattern: Dynamic PV \(default fs\)\] capacity provides storage capacity information'
)

mode=${1:-whole}
want=
case $mode in
whole)
	focus="$driver"
	skip='\[Disruptive\]|\[Serial\]|\[Feature:VolumeSnapshotDataSource\].*\[Slow\]'
	out=$K8S_WORK/logs/conformance
	procs=4
	;;
quick)
	focus="$driver ($(IFS='|'; echo "${quick[*]}"))"
	skip='\[Disruptive\]|\[Serial\]'
	out=$K8S_WORK/logs/conformance-quick
	procs=1
	[[ -n ${CONFORMANCE_FOCUS:-} ]] || want=${#quick[@]}
	;;
*) die "usage: conformance.sh [whole|quick]" ;;
esac
focus=${CONFORMANCE_FOCUS:-$focus}
skip=${CONFORMANCE_SKIP:-$skip}
procs=${CONFORMANCE_PROCS:-$procs}
[[ -x $K8S_BIN/storage-e2e.test && -x $K8S_BIN/ginkgo ]] ||
	die "$K8S_BIN/storage-e2e.test or ginkgo missing: run hack/k8s/install.sh e2e"
[[ -e /run/netns/fbk-k8s-cp ]] || die "no cluster: run hack/k8s/cluster.sh up"
# summary DIR writes DIR/summary: the count of specs selected, passed, failed
# and skipped at run time (patterns the driver does not claim), then each
# spec that ran with its result and seconds, from the JUnit report.
summary() {
	local sel
	sel=$(grep -oE 'suite - [0-9]+/[0-9]+ specs' "$1/e2e.log" | head -n1 | sed -E 's/suite - ([0-9]+).*/\1/')
	[[ -s $1/junit_01.xml ]] || { echo "selected ${sel:-?}: no JUnit report" >"$1/summary"; return 0; }
	grep -oE '<testcase name="\[It\] [^"]*" classname="[^"]*" status="[^"]*" time="[0-9]+' "$1/junit_01.xml" |
		sed -nE 's/^<testcase name="\[It\] External Storage \[Driver: [^]]*\] ([^"]*)" classname="[^"]*" status="([^"]*)" time="([0-9]+)$/\2 \3 \1/p' |
		awk -v sel="${sel:-0}" '
		$1 != "skipped" {n[$1]++; ran++; line[ran] = $0}
		END {
			printf "selected %d: passed %d, failed %d, skipped at run time %d", sel, n["passed"], n["failed"], sel - ran
			for (s in n) if (s != "passed" && s != "failed") printf ", %s %d", s, n[s]
			printf "\n"
			for (i = 1; i <= ran; i++) {
				split(line[i], f, " ")
				sub(/^[^ ]+ [^ ]+ /, "", line[i])
				printf "  %-8s %5ss  %s\n", f[1], f[2], line[i]
			}
		}' >"$1/summary"
}

rm -rf "$out" && mkdir -p "$out"
log "storage-e2e.test ($mode, $procs procs): focus '$focus', skip '$skip'"
rc=0
# The JUnit report is the e2e framework's (-report-dir), which the first
# process writes for all of them at the end.
nsenter --net=/run/netns/fbk-k8s-cp -- "$K8S_BIN/ginkgo" run --procs="$procs" \
	--focus="$focus" --skip="$skip" --timeout=3h --no-color --succinct \
	"$K8S_BIN/storage-e2e.test" -- \
	-kubeconfig="$K8S_WORK/admin.kubeconfig" -kubectl-path="$K8S_BIN/kubectl" \
	-storage.testdriver="$ROOT/test/k8s/conformance/driver.yaml" -repo-root="$ROOT" \
	-report-dir="$out" >"$out/e2e.log" 2>&1 || rc=$?
summary "$out"
grep -E '^ *\[FAIL\]' "$out/e2e.log" >&2 || true
cat "$out/summary" >&2
if [[ -n $want ]] && ! head -n1 "$out/summary" | grep -q "^selected $want:"; then
	log "error: the quick subset should select $want specs, one per pattern (a renamed spec?)"
	rc=1
fi
log "storage-e2e.test exit $rc; log $out/e2e.log, JUnit report and summary in $out"
exit "$rc"
