# Shared by hack/k8s/*.sh: versions, paths and helpers of the two-node
# Kubernetes harness (issue 22). Everything built or downloaded lives under
# $K8S_CACHE; everything a running cluster writes lives under $K8S_WORK.
# shellcheck shell=bash

KUBE_VERSION=v1.36.3
K8S_CACHE="${K8S_CACHE:-/var/cache/csi-fastblk-k8s}"
K8S_WORK="${K8S_WORK:-/var/lib/csi-fastblk-k8s}"
K8S_BIN="$K8S_CACHE/bin"
# The background build make test starts before its other phases
# (prebuild.sh): its log and process group.
PREBUILD_LOG="$K8S_CACHE/prebuild.log"
PREBUILD_PID="$K8S_CACHE/prebuild.pid"
# The CSI sidecars' binaries, one per tag, as
# $K8S_BIN/sidecars/<command>-<tag> (see sidecars in install.sh).

# The csi-resizer the cluster runs: the chart's default (v2) is a /v2
# module path the Go module proxy refuses, so the harness builds the newest
# release it serves, v1.14.0, and installs the chart with its tag and
# RESIZER_ARGS (helm in cluster.sh). v1.14 modifies volumes only with its
# VolumeAttributesClass feature gate, and reads the class at
# storage.k8s.io/v1beta1, which the API server then serves
# (--runtime-config in cluster.sh).
RESIZER_TAG=v1.14.0
RESIZER_ARGS=--feature-gates=VolumeAttributesClass=true

# Each node's two device-class disks (node.sh): sparse images of this size,
# one xfs (its least size is 300 MB) and one ext4, at
# /var/lib/fastblk-classes/{xfs,ext4} in the node's mount namespace.
CLASS_DISK_SIZE=512M

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Images the cluster runs besides the chart's: the sandbox image containerd
# is told to use, and the test workload images (the references Kubernetes'
# own e2e suite uses, from test/utils/image/manifest.go of $KUBE_VERSION).
PAUSE_TAG=3.10.2
PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_TAG
BUSYBOX_TAG=1.37.0-1
BUSYBOX_IMAGE=registry.k8s.io/e2e-test-images/busybox:$BUSYBOX_TAG
AGNHOST_TAG=2.63.0
AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_TAG
GLIBC_TAG=2.0.0
GLIBC_IMAGE=registry.k8s.io/e2e-test-images/glibc-dns-testing:$GLIBC_TAG
NGINX_TAG=1.15-4
NGINX_IMAGE=registry.k8s.io/e2e-test-images/nginx:$NGINX_TAG
# The backup client of the changed-block test (hack/k8s/snapshotlister,
# test/k8s/snapshotmetadata_test.go), built with the csi-snapshot-metadata
# sidecar from its module.
LISTER_IMAGE=csi-fastblk.local/snapshot-metadata-lister:e2e
