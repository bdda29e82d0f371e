#!/usr/bin/env bash
# Regenerates deploy/ (plain manifests for kubectl apply) from the Helm chart,
# which is the single source of the manifests. `make deploy` runs it;
# hack/chart/test.sh fails when deploy/ differs from a fresh render.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/chart/lib.sh
. "$ROOT/hack/chart/lib.sh"

ensure_helm
render_deploy "$ROOT/deploy"
echo "deploy/ rendered from charts/csi-fastblk with helm $HELM_VERSION"
