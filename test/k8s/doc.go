// Package k8s holds the user's path on a real two-node Kubernetes (issue 22):
// helm install of charts/csi-fastblk with locally built images, then PVCs,
// pods, expansion, snapshots, clones, raw block volumes, kubelet's volume
// stats, a plugin restart under I/O, and cleanup that leaves nothing on the
// nodes. hack/k8s/e2e.sh (`make e2e-k8s`) builds and starts the cluster and
// runs these tests with FASTBLK_K8S set to hack/k8s/cluster.sh; without it
// they skip. The tests share the cluster but not their objects: each makes
// the claims it uses, and the first that needs the chart installs it, so any
// -run subset runs alone. go test runs them in file order, then source
// order: TestHelmInstall and the tests before it in userpath_test.go try
// installs of their own first, so a test that installs the chart belongs
// in userpath_test.go after them (or in a file that sorts after it:
// zsnapshotmetadata_test.go, which runs after TestCleanup and so makes and
// removes its own objects).
// After them e2e.sh runs the quick subset of
// Kubernetes' external storage suite on the same cluster (hack/k8s/conformance.sh).
package k8s
