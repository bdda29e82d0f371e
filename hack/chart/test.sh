#!/usr/bin/env bash
# Chart checks (Makefile target chart-test, part of `make test`):
#   1. build the pinned helm from its Go module (cached; instant the second time),
#   2. helm lint and helm template with default and non-default values,
#   3. the Go tests in test/chart: images from values, socket and registration
#      paths, kubelet directory, schema failures, CSIDriver/StorageClass/CRD
#      shape, snapshot class gating with and without the snapshot API,
#      NOTES.txt warnings, node groups, sidecar flags and probes, the upstream
#      CRDs, the generated README ("run make chart-readme") and deploy/
#      freshness ("run make deploy"),
#   4. the container image: hack/image/build.sh (amd64 and arm64) into a
#      temporary archive (about 45 s with the .deb cache, a few minutes on a
#      fresh machine), TestImageArchive on it, and, where containerd, ctr
#      and runc are installed, TestImageImportsIntoContainerd (a private
#      containerd). CHART_TEST_IMAGE=0 skips this step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/chart/lib.sh
. "$ROOT/hack/chart/lib.sh"
cd "$ROOT"

ensure_helm
"$HELM" version --short

chart=charts/csi-fastblk
declare -A sets=(
	[default]=""
	[k0s]="--set kubeletDir=/var/lib/k0s/kubelet"
	[microk8s]="--set kubeletDir=/var/snap/microk8s/common/var/lib/kubelet"
	[custom-images]="--set plugin.image.repository=registry.local/csi-fastblk --set plugin.image.tag=test --set provisioner.image.repository=registry.local/csi-provisioner --set resizer.image.tag=v0.0.1"
	[metrics-off]="--set metrics.enabled=false"
	[snapshot-controller]="--set snapshotController.install=true --api-versions snapshot.storage.k8s.io/v1"
	[distributed-in-cluster]="--set snapshotController.distributedInCluster=true --api-versions snapshot.storage.k8s.io/v1"
	[node-groups]="--set nodeGroups[0].name=nvme,nodeGroups[0].nodeSelector.disk=nvme,nodeGroups[0].dataDir=/mnt/fastblk,nodeGroups[0].reserve=10Gi"
	[admission]="--set namespace.create=true,namespace.name=fastblk-system,priorityClass.create=true"
	[device-classes]="--set deviceClasses[0].name=nvme,deviceClasses[0].path=/mnt/fastblk/nvme,deviceClasses[0].reserve=5%,deviceClasses[1].name=hdd,deviceClasses[1].path=/srv/hdd/fastblk,storageClass.deviceClass=nvme"
	[classes]="--set storageClasses[0].name=fastblk-xfs,storageClasses[0].fsType=xfs,storageClasses[1].name=capped,storageClasses[1].maxIOPS=1000,storageClasses[2].name=thick,storageClasses[2].preallocation=falloc"
	[monitoring]="--set metrics.monitor.enabled=true --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true"
	[snapshot-metadata]="--set snapshotMetadata.enabled=true --set snapshotMetadata.service.clusterIP=10.96.0.53 --api-versions cbt.storage.k8s.io/v1beta1"
	[service-monitor]="--set metrics.monitor.enabled=true --set metrics.monitor.kind=ServiceMonitor --set uninstallCheck.allowWithVolumes=true"
)
for name in "${!sets[@]}"; do
	# shellcheck disable=SC2086 # the value sets are word lists on purpose
	# helm lint takes no --api-versions: it lints with the --set part only.
	# shellcheck disable=SC2086
	"$HELM" lint --strict --quiet "$chart" --kube-version "$KUBE_VERSION" ${sets[$name]%%--api-versions*} >/dev/null
	# shellcheck disable=SC2086
	n=$("$HELM" template csi-fastblk "$chart" -n csi-fastblk --kube-version "$KUBE_VERSION" ${sets[$name]} | grep -c '^kind:')
	echo "chart $name: lint ok, $n objects"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/go-test.log
image_env=()
if [[ ${CHART_TEST_IMAGE:-1} != 0 ]]; then
	OUT="$tmp/csi-fastblk-image.oci.tar" hack/image/build.sh
	image_env=(IMAGE_ARCHIVE="$tmp/csi-fastblk-image.oci.tar")
fi
set +e
env HELM="$HELM" "${image_env[@]}" go test -count=1 -v ./test/chart/ >"$log" 2>&1
rc=$?
set -e
grep -E '^(--- |\s+--- FAIL|PASS|FAIL|ok)' "$log" || true
if [[ $rc -ne 0 ]]; then
	cat "$log"
	exit "$rc"
fi
