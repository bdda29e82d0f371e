// Package chart checks the Helm chart in charts/csi-fastblk and the plain
// manifests in deploy/ that are rendered from it.
//
// The tests run a pinned helm binary (built by hack/chart/test.sh from its Go
// module; found through $HELM or the build cache) to render the chart with
// default and non-default values, decode the objects into small local structs
// and check what a cluster would otherwise only reveal at run time: every
// container image comes from values, the plugin (which registers itself) and the
// kubelet agree on the socket and registration paths, the kubelet directory
// value reaches every kubelet mount, bad values fail with a clear schema
// message, and deploy/ is a fresh render. Without helm the tests skip.
package chart
