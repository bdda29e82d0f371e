// Package kubeletreg registers a CSI plugin with the kubelet from inside the
// plugin, in place of the node-driver-registrar sidecar.
//
// It serves the Registration service of kubelet's plugin registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on "<driver>-reg.sock" in
// the kubelet's plugin registration directory (<kubelet dir>/plugins_registry).
// The kubelet finds the socket (by inotify, and by a scan when it starts),
// calls GetInfo, which names the plugin's CSI endpoint as the kubelet sees
// it, checks the endpoint with NodeGetInfo, and reports the outcome with
// NotifyRegistrationStatus. A refusal ends Run with an error: the plugin
// exits, its container restarts and registers from scratch, which is how
// the kubelet expects a plugin to retry.
//
// Run owns the socket file: it replaces a stale one at start and removes its
// own at return. A Server is safe for concurrent use.
package kubeletreg
