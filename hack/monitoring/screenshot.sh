#!/usr/bin/env bash
# Renders the chart's Grafana dashboard on real metrics, for
# docs/dashboard.png, on this machine and without Grafana (Grafana is not in
# Debian's archive and cannot be built here: its UI needs a large frontend
# build). What it does, as root:
#   1. installs chromium from Debian, and unpacks Debian's prometheus (2.42,
#      its classic UI and console templates) with the JavaScript packages
#      its UI links to into a private root under the cache;
#   2. starts the plugin (loop backend, data in a temporary directory,
#      metrics on 127.0.0.1) and Prometheus scraping it every 2 s with the
#      labels the chart's PodMonitor sets (job, node; honor_labels);
#   3. hack/monitoring/demo gives the plugin four volumes with PVC names
#      and a different I/O pattern each; after DEMO_SECONDS (default 240)
#      of it, the screenshot is taken, and the demo deletes its volumes;
#   4. hack/monitoring/console turns the dashboard JSON into a Prometheus
#      console template (every panel's own queries and legends; the
#      dashboard's variables select everything), and headless chromium
#      screenshots it from Prometheus, at http://127.0.0.1:19090/consoles/.
# Every connection stays on 127.0.0.1: chromium's other traffic goes to a
# proxy address that does not answer.
# Usage: hack/monitoring/screenshot.sh [OUT.png]   (default docs/dashboard.png)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${1:-docs/dashboard.png}"
CACHE="${CSI_FASTBLK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-fastblk}"
PROM_ROOT="$CACHE/prometheus-root"
METRICS=127.0.0.1:19811 PROM=127.0.0.1:19090
DEMO_SECONDS=${DEMO_SECONDS:-240}
[[ $(id -u) == 0 ]] || { echo "screenshot.sh: run as root (the plugin attaches loop devices)" >&2; exit 1; }

command -v chromium >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; }
if [[ ! -x $PROM_ROOT/usr/bin/prometheus ]]; then
	mkdir -p "$CACHE/debs" "$PROM_ROOT"
	pkgs=(prometheus javascript-common fonts-glyphicons-halflings libjs-bootstrap libjs-bootstrap4 libjs-d3
		libjs-eonasdan-bootstrap-datetimepicker libjs-jquery libjs-jquery-hotkeys libjs-moment libjs-moment-timezone
		libjs-mustache libjs-popper.js libjs-rickshaw)
	(cd "$CACHE/debs" && apt-get download -qq -o APT::Sandbox::User=root "${pkgs[@]}")
	for p in "${pkgs[@]}"; do
		dpkg-deb -x "$(ls -t "$CACHE/debs/${p}_"*.deb | head -n1)" "$PROM_ROOT"
	done
fi

work=$(mktemp -d /tmp/csi-fastblk-shot.XXXXXX)
pids=()
cleanup() {
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null && wait "${pids[i]}" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

go build -ldflags "-X main.version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)" -o "$work/csi-fastblk" ./cmd/csi-fastblk
"$work/csi-fastblk" serve --backend loop --endpoint "unix://$work/csi.sock" --data-dir "$work/data" \
	--dev-dir "$work/dev" --node-id demo-node --metrics-address "$METRICS" >"$work/plugin.log" 2>&1 &
pids+=($!)

mkdir -p "$work/consoles"
go run ./hack/monitoring/console -rate 30s -duration $((DEMO_SECONDS + 60)) charts/csi-fastblk/dashboards/csi-fastblk.json \
	>"$work/consoles/csi-fastblk.html"
cat >"$work/prometheus.yml" <<YAML
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: csi-fastblk
    honor_labels: true
    static_configs:
      - targets: ["$METRICS"]
        labels: {node: demo-node}
YAML
"$PROM_ROOT/usr/bin/prometheus" --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/tsdb" \
	--web.listen-address "$PROM" --web.local-assets "$PROM_ROOT/usr/share/prometheus/web/" \
	--web.console.templates "$work/consoles" \
	--web.console.libraries "$PROM_ROOT/usr/share/doc/prometheus/examples/console_libraries" >"$work/prometheus.log" 2>&1 &
pids+=($!)

for _ in $(seq 100); do [[ -S $work/csi.sock ]] && break; sleep 0.1; done
go build -o "$work/demo" ./hack/monitoring/demo
"$work/demo" -endpoint "unix://$work/csi.sock" -dir "$work" -duration 1h >"$work/demo.log" 2>&1 &
demo=$!
sleep "$DEMO_SECONDS"
chromium --headless=new --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
	--disable-sync --disable-default-apps --no-first-run --disable-domain-reliability --disable-breakpad \
	--proxy-server=http://127.0.0.1:9 --proxy-bypass-list='127.0.0.1' --hide-scrollbars \
	--window-size=1400,3300 --virtual-time-budget=20000 --screenshot="$work/shot.png" \
	"http://$PROM/consoles/csi-fastblk.html" 2>"$work/chromium.log"
# SIGTERM: the demo stops its I/O and deletes its volumes.
kill -TERM "$demo"
wait "$demo" || { cat "$work/demo.log" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
cp "$work/shot.png" "$OUT"
echo "screenshot: $OUT ($(du -h "$OUT" | cut -f1)); Prometheus $("$PROM_ROOT/usr/bin/prometheus" --version 2>&1 | head -n1)"
