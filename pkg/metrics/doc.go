// Package metrics serves the plugin's observability endpoints: Prometheus
// metrics at /metrics (per-volume I/O, latency, queue geometry, device state,
// node capacity) and /healthz on the network-facing listener (Handler), and
// the node status as JSON at /status (read by `csi-fastblk status`), which
// names volumes and paths and so is served on a local-only listener
// (StatusHandler) unless the operator exposes it.
//
// Everything is computed at scrape time from a StatusFunc; the package keeps
// no counters of its own, so it adds nothing to the I/O path.
package metrics
