// Package kubeapi connects the plugin to the Kubernetes API server with
// client-go: the in-cluster configuration (whose token client-go reads
// again as the kubelet renews it), the client-side rate limits, the
// resources the plugin uses, and the conversion between client-go's
// dynamic client and the k8s.io/api types.
package kubeapi
