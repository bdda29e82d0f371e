// Package kubeapi is a small client of the Kubernetes API server: GET of
// one object, LIST of a collection with pagination, POST of a new object
// (or of a review, whose answer is read), a merge PATCH and a DELETE of
// one, as JSON over HTTPS with the pod's service account token and the
// cluster's CA. The plugin binary needs no more than that, so it carries
// no client library. A Client is safe for concurrent use.
package kubeapi
