// Package uninstall decides whether csi-fastblk may be removed from a
// cluster: it lists, through the Kubernetes API with the service account
// of the pod it runs in, the PersistentVolumes and VolumeAttachments of the
// driver, and reports them. The chart's pre-delete hook runs it
// (`csi-fastblk uninstall-check`) and refuses `helm uninstall` while any
// exist: without the plugin, their pods could not unmount them and would
// hang terminating, and ublk devices would hold their I/O.
//
// It lists through kubeapi's small client, so the plugin binary needs no
// client library.
package uninstall
