#!/usr/bin/env bash
# Puts the upstream CRDs the chart relies on, unmodified, into the chart's
# crds/ directory (make chart-crds), through the Go module proxy and checked
# against the Go checksum database like any module:
#   - snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io (group
#     snapshots), from github.com/kubernetes-csi/external-snapshotter/client/v8
#     (config/crd/) at the version of the csi-snapshotter image the chart
#     runs (snapshotter.image.tag in values.yaml);
#   - cbt.storage.k8s.io (SnapshotMetadataService), from
#     github.com/kubernetes-csi/external-snapshot-metadata/client (config/crd/)
#     at the version of the csi-snapshot-metadata image
#     (snapshotMetadata.image.tag).
# TestSnapshotCRDsAreUpstream fails when crds/ differs from them.
#
#   hack/chart/snapshot-crds.sh          write charts/csi-fastblk/crds/
#   hack/chart/snapshot-crds.sh --dir    print the snapshot module's CRD directory only
#   hack/chart/snapshot-crds.sh --cbt-dir    print the snapshot metadata module's CRD directory only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chart=$ROOT/charts/csi-fastblk
module=github.com/kubernetes-csi/external-snapshotter/client/v8
cbtmodule=github.com/kubernetes-csi/external-snapshot-metadata/client

tag() { awk -v s="$1:" '$1 == s {f = 1} f && $1 == "tag:" {print $2; exit}' "$chart/values.yaml"; }
version=$(tag snapshotter)
[[ $version =~ ^v8\.[0-9]+\.[0-9]+$ ]] || { echo "snapshotter.image.tag $version: want v8.x.y" >&2; exit 1; }
cbtversion=$(tag snapshotMetadata)
[[ $cbtversion =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "snapshotMetadata.image.tag $cbtversion: want vX.Y.Z" >&2; exit 1; }
# go mod download needs a module context; an empty temporary one will do.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && go mod init crds >/dev/null 2>&1)
moddir() { (cd "$tmp" && go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }
dir=$(moddir "$module@$version")
[[ -d $dir/config/crd ]] || { echo "$module@$version has no config/crd" >&2; exit 1; }
cbtdir=$(moddir "$cbtmodule@$cbtversion")
[[ -d $cbtdir/config/crd ]] || { echo "$cbtmodule@$cbtversion has no config/crd" >&2; exit 1; }
case ${1:-} in
--dir) echo "$dir/config/crd"; exit 0 ;;
--cbt-dir) echo "$cbtdir/config/crd"; exit 0 ;;
esac
rm -f "$chart"/crds/*.yaml
for f in "$dir"/config/crd/snapshot.storage.k8s.io_*.yaml "$dir"/config/crd/groupsnapshot.storage.k8s.io_*.yaml \
	"$cbtdir"/config/crd/cbt.storage.k8s.io_*.yaml; do
	install -m 0644 "$f" "$chart/crds/"
done
# Their licences (Apache-2.0) travel with them; Helm reads only *.yaml,
# *.yml and *.json from crds/.
install -m 0644 "$dir/LICENSE" "$chart/crds/LICENSE"
install -m 0644 "$cbtdir/LICENSE" "$chart/crds/LICENSE.cbt"
echo "charts/csi-fastblk/crds: snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io CRDs of $module@$version, cbt.storage.k8s.io of $cbtmodule@$cbtversion"
ls "$chart/crds"
