package uninstall

import (
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// topologyKey is the node label of the driver's volumes' node affinity.
const topologyKey = "topology.fastblk.csi.io/node"

// Volume is a PersistentVolume of the driver.
type Volume struct {
	Name, Claim, Phase, Node, ReclaimPolicy string
}

// Attachment is a VolumeAttachment of the driver.
type Attachment struct {
	Name, Volume, Node string
	Attached           bool
}

// Report is what of the driver is left in the cluster.
type Report struct {
	Driver      string
	Volumes     []Volume
	Attachments []Attachment
}

// InUse reports whether anything of the driver is left.
func (r Report) InUse() bool { return len(r.Volumes) > 0 || len(r.Attachments) > 0 }

// Check lists the PersistentVolumes and VolumeAttachments of driver.
func Check(ctx context.Context, c dynamic.Interface, driver string) (Report, error) {
	r := Report{Driver: driver}
	err := kubeapi.EachItem(ctx, c, kubeapi.PersistentVolumes, metav1.ListOptions{}, func(pv *corev1.PersistentVolume) error {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
			return nil
		}
		v := Volume{Name: pv.Name, Phase: string(pv.Status.Phase), ReclaimPolicy: string(pv.Spec.PersistentVolumeReclaimPolicy), Node: volumeNode(pv)}
		if ref := pv.Spec.ClaimRef; ref != nil {
			v.Claim = ref.Namespace + "/" + ref.Name
		}
		r.Volumes = append(r.Volumes, v)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("list PersistentVolumes: %w", err)
	}
	err = kubeapi.EachItem(ctx, c, kubeapi.VolumeAttachments, metav1.ListOptions{}, func(va *storagev1.VolumeAttachment) error {
		if va.Spec.Attacher != driver {
			return nil
		}
		a := Attachment{Name: va.Name, Node: va.Spec.NodeName, Attached: va.Status.Attached}
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			a.Volume = *pv
		}
		r.Attachments = append(r.Attachments, a)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	return r, nil
}

// AllowAnnotation, set to "true" on the driver's CSIDriver object, lets the
// check pass with volumes left. It is the override that still works after a
// refused helm uninstall: Helm then keeps the release as "uninstalling" and
// refuses helm upgrade, so a chart value cannot be changed until helm
// rollback; the annotation goes with the CSIDriver when the uninstall
// completes.
const AllowAnnotation = "fastblk.csi.io/allow-uninstall-with-volumes"

// Allowed reports whether the driver's CSIDriver object carries
// AllowAnnotation="true" (false when there is no such object).
func Allowed(ctx context.Context, c dynamic.Interface, driver string) (bool, error) {
	d, err := kubeapi.Get[storagev1.CSIDriver](ctx, c, kubeapi.CSIDrivers, "", driver)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get CSIDriver %s: %w", driver, err)
	}
	return d.Annotations[AllowAnnotation] == "true", nil
}

// Write prints the report for an operator.
func (r Report) Write(w io.Writer) {
	if !r.InUse() {
		fmt.Fprintf(w, "no PersistentVolume or VolumeAttachment of %s is left\n", r.Driver)
		return
	}
	fmt.Fprintf(w, "%d PersistentVolumes and %d VolumeAttachments of %s are left:\n", len(r.Volumes), len(r.Attachments), r.Driver)
	for _, v := range r.Volumes {
		fmt.Fprintf(w, "  pv %s  claim %s  phase %s  node %s  reclaim %s\n", v.Name, dash(v.Claim), dash(v.Phase), dash(v.Node), dash(v.ReclaimPolicy))
	}
	for _, a := range r.Attachments {
		fmt.Fprintf(w, "  volumeattachment %s  pv %s  node %s  attached %t\n", a.Name, dash(a.Volume), dash(a.Node), a.Attached)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// volumeNode is the node the volume lives on, from its node affinity.
func volumeNode(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == topologyKey && len(e.Values) > 0 {
				return e.Values[0]
			}
		}
	}
	return ""
}
