#!/usr/bin/env bash
# Puts the upstream snapshot.storage.k8s.io CRDs, unmodified, into the
# chart's crds/ directory (make chart-crds). They come from the Go module
# github.com/kubernetes-csi/external-snapshotter/client/v8 (config/crd/), at
# the version of the csi-snapshotter image the chart runs
# (snapshotter.image.tag in values.yaml), through the Go module proxy and
# checked against the Go checksum database like any module.
# TestSnapshotCRDsAreUpstream fails when crds/ differs from them.
#
#   hack/chart/snapshot-crds.sh          write charts/csi-fastblk/crds/
#   hack/chart/snapshot-crds.sh --dir    print the module's CRD directory only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chart=$ROOT/charts/csi-fastblk
module=github.com/kubernetes-csi/external-snapshotter/client/v8

version=$(awk '/^snapshotter:/{s=1} s && /^ +tag:/{print $2; exit}' "$chart/values.yaml")
[[ $version =~ ^v8\.[0-9]+\.[0-9]+$ ]] || { echo "snapshotter.image.tag $version: want v8.x.y" >&2; exit 1; }
# go mod download needs a module context; an empty temporary one will do.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && go mod init crds >/dev/null 2>&1)
dir=$(cd "$tmp" && go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -d $dir/config/crd ]] || { echo "$module@$version has no config/crd" >&2; exit 1; }
if [[ ${1:-} == --dir ]]; then
	echo "$dir/config/crd"
	exit 0
fi
rm -f "$chart"/crds/*.yaml
for f in "$dir"/config/crd/snapshot.storage.k8s.io_*.yaml; do
	install -m 0644 "$f" "$chart/crds/"
done
# Their licence (Apache-2.0) travels with them; Helm reads only *.yaml,
# *.yml and *.json from crds/.
install -m 0644 "$dir/LICENSE" "$chart/crds/LICENSE"
echo "charts/csi-fastblk/crds: snapshot.storage.k8s.io CRDs of $module@$version"
ls "$chart/crds"
