package nodeloss

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Kept says which of a node's volumes (their CSI IDs) it keeps although
// no claim uses them: those whose PV was released while the node was
// deleted (AnnReleasedClaim), and those no PV names at all. Each is
// logged, and each released one gets an event on its PV. The answer maps
// the volume's CSI ID to why it is kept and what an operator may do.
func Kept(ctx context.Context, api dynamic.Interface, driver, node string, volumeIDs []string) (map[string]string, error) {
	pvs := map[string]*corev1.PersistentVolume{}
	err := kubeapi.EachItem(ctx, api, kubeapi.PersistentVolumes, metav1.ListOptions{}, func(pv *corev1.PersistentVolume) error {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
			pvs[pv.Spec.CSI.VolumeHandle] = pv
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list PVs: %w", err)
	}
	kept := map[string]string{}
	for _, id := range volumeIDs {
		pv := pvs[id]
		switch {
		case pv == nil:
			kept[id] = "no PV names it (its PV was deleted while its data stayed here): delete its file by hand if it is not wanted"
		case pv.Annotations[AnnReleasedClaim] != "":
			kept[id] = fmt.Sprintf("its claim %s was released at %s while node %s was deleted; its PV %s is %s with reclaim policy %s: "+
				"bind it to a new claim to use the data again, or set the reclaim policy to Delete to remove it",
				pv.Annotations[AnnReleasedClaim], pv.Annotations[AnnReleasedAt], node, pv.Name, pv.Status.Phase, pv.Spec.PersistentVolumeReclaimPolicy)
			postEvent(ctx, api, corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolume", Name: pv.Name, UID: pv.UID},
				corev1.EventTypeNormal, "VolumeKept", fmt.Sprintf("node %s is back and keeps volume %s: %s", node, id, kept[id]), "csi-fastblk-"+node)
		default:
			continue
		}
		klog.InfoS("volume kept without a claim", "volumeID", id, "why", kept[id])
	}
	return kept, nil
}
