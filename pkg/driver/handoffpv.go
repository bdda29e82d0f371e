package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// A handed-off volume lives on the source's node, so its PV is that
// node's object: no node's account may make another node's PV (the
// chart's node-volumes admission policy; docs/peer.md, "Threat model"),
// so the node that made the volume makes its PV too, pre-bound to the
// claim, named as the external-provisioner names it (pvc-<claim uid>).
// The requester's provisioner then finds the PV there and stops; the
// scheduler finds the claim bound to a volume of the source's node and
// moves the pod there.

// handoffPVMaker makes the PV of a volume handed off to this node.
type handoffPVMaker interface {
	HandoffPV(ctx context.Context, req *csi.CreateVolumeRequest, vol *csi.Volume) error
}

// HandoffPV makes the PV of vol, made here for the claim that req names
// (its namespace and name from the provisioner's metadata), as the
// external-provisioner would: the claim's access modes and volume mode,
// its class's reclaim policy, mount options and file system type, the
// volume's capacity, context and topology. A PV of that name already
// there (a retry) is taken as made.
func (a *APIAuthorizer) HandoffPV(ctx context.Context, req *csi.CreateVolumeRequest, vol *csi.Volume) error {
	ns, name := req.GetParameters()[ParamPVCNamespace], req.GetParameters()[ParamPVCName]
	claim, err := a.claim(ctx, ns, name, "claim "+ns+"/"+name)
	if err != nil {
		return err
	}
	reclaim, fsType, mountOptions := corev1.PersistentVolumeReclaimDelete, "", []string(nil)
	class := ""
	if c := claim.Spec.StorageClassName; c != nil {
		class = *c
		sc, err := kubeapi.Get[storagev1.StorageClass](ctx, a.API, kubeapi.StorageClasses, "", class)
		if err != nil {
			return got(err, "StorageClass "+class)
		}
		if sc.ReclaimPolicy != nil {
			reclaim = *sc.ReclaimPolicy
		}
		fsType, mountOptions = sc.Parameters["csi.storage.k8s.io/fstype"], sc.MountOptions
	}
	var terms []corev1.NodeSelectorTerm
	for _, t := range vol.GetAccessibleTopology() {
		var exprs []corev1.NodeSelectorRequirement
		for k, v := range t.GetSegments() {
			exprs = append(exprs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{v}})
		}
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: exprs})
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "pvc-" + string(claim.UID),
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": a.Driver},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(vol.GetCapacityBytes(), resource.BinarySI)},
			AccessModes:                   claim.Spec.AccessModes,
			VolumeMode:                    claim.Spec.VolumeMode,
			StorageClassName:              class,
			MountOptions:                  mountOptions,
			PersistentVolumeReclaimPolicy: reclaim,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: a.Driver, VolumeHandle: vol.GetVolumeId(), FSType: fsType, VolumeAttributes: vol.GetVolumeContext()}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}},
		},
	}
	if _, err := kubeapi.Create(ctx, a.API, kubeapi.PersistentVolumes, "", pv); err != nil && !apierrors.IsAlreadyExists(err) {
		return status.Errorf(codes.Unavailable, "handoff: make PV %s of volume %s: %v", pv.Name, vol.GetVolumeId(), err)
	}
	klog.InfoS("made the PV of a handed-off volume", "pv", pv.Name, "volumeID", vol.GetVolumeId(), "claim", ns+"/"+name)
	return nil
}

// errHandedOff is the requester's answer to its provisioner once the
// source's node made the volume and its PV: Aborted, which it retries,
// and at the retry it finds the PV and stops.
func errHandedOff(vol *csi.Volume, node string) error {
	return status.Errorf(codes.Aborted, "handed off to %s: it made volume %s and its PV, to which the claim binds; the pod moves there",
		node, vol.GetVolumeId())
}
