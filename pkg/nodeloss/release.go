// Package nodeloss owns what happens to the volumes of a node that is gone
// for good. A node-local volume lives and dies with its node: when an
// operator deletes a Node object (their statement that the machine will
// not come back), the claims bound to its volumes can never be mounted
// again, and a StatefulSet's pod that uses one stays Pending for ever. The
// controller's Releaser lets such claims go where a policy says so (off
// by default): the claim is deleted and its PV kept (Released, reclaim
// policy Retain, annotated with the claim it held), so that the
// StatefulSet makes the claim again and its pod gets a new, empty volume
// on another node; the replication above the volume restores the data.
// Nothing is released while the Node object exists. A node that comes
// back finds its volumes' files and says which it keeps (Kept).
package nodeloss

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

const (
	// AnnRelease on a StorageClass or a claim, "true" or "false", says
	// whether a claim is released when its volume's node is deleted; the
	// claim's wins over its class's, which wins over the default.
	AnnRelease = "fastblk.csi.io/release-on-node-deletion"
	// AnnReleasedClaim on a PV names the claim it held before the
	// release: "<namespace>/<name>", and AnnReleasedAt when (RFC 3339).
	AnnReleasedClaim = "fastblk.csi.io/released-claim"
	AnnReleasedAt    = "fastblk.csi.io/released-at"
	// AnnReleasedNode is the deleted node the PV's volume lives on.
	AnnReleasedNode = "fastblk.csi.io/released-node"

	annSelectedNode = "volume.kubernetes.io/selected-node"
	component       = "csi-fastblk-controller"
)

// Releaser releases the claims of deleted nodes' volumes.
type Releaser struct {
	API         dynamic.Interface
	Driver      string // the CSI driver whose PVs it looks at
	TopologyKey string // the PVs' node-affinity key naming their node
	Default     bool   // release where neither claim nor class says
	Interval    time.Duration

	nodes, pvs cache.SharedIndexInformer
	mu         sync.Mutex
	told       map[types.UID]bool // claims told they are kept (one event each)
}

// Run watches Nodes and PVs and, every Interval, releases what it may,
// until ctx ends.
func (r *Releaser) Run(ctx context.Context) {
	r.nodes = kubeapi.NewInformer[corev1.Node](r.API, kubeapi.Nodes, "", "")
	r.pvs = kubeapi.NewInformer[corev1.PersistentVolume](r.API, kubeapi.PersistentVolumes, "", "")
	go r.nodes.RunWithContext(ctx)
	go r.pvs.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), r.nodes.HasSynced, r.pvs.HasSynced) {
		return
	}
	klog.InfoS("releasing the claims of deleted nodes' volumes", "driver", r.Driver, "default", r.Default)
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		r.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass looks once at every bound PV of the driver whose node has no Node
// object.
func (r *Releaser) Pass(ctx context.Context) {
	for _, obj := range r.pvs.GetStore().List() {
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.ClaimRef == nil || pv.Status.Phase != corev1.VolumeBound {
			continue
		}
		node := VolumeNode(pv, r.Driver, r.TopologyKey)
		if node == "" {
			continue
		}
		if _, exists, _ := r.nodes.GetStore().GetByKey(node); exists {
			continue
		}
		// The watch may lag: only the API server's NotFound says gone.
		if _, err := kubeapi.Get[corev1.Node](ctx, r.API, kubeapi.Nodes, "", node); !apierrors.IsNotFound(err) {
			continue
		}
		if err := r.release(ctx, pv, node); err != nil {
			klog.ErrorS(err, "release of a deleted node's claim failed; retrying", "pv", pv.Name, "node", node)
		}
	}
}

// VolumeNode is the node a PV of driver is pinned to by its node affinity
// on key, or "".
func VolumeNode(pv *corev1.PersistentVolume, driver, key string) string {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == key && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// release lets the claim of pv go, if the policy says so: the PV kept
// (Retain, annotated), an event on the claim, the claim deleted (that
// uid only). Each step is idempotent; a failed one is retried at the next
// pass.
func (r *Releaser) release(ctx context.Context, pv *corev1.PersistentVolume, node string) error {
	ref := pv.Spec.ClaimRef
	claim, err := kubeapi.Get[corev1.PersistentVolumeClaim](ctx, r.API, kubeapi.PersistentVolumeClaims, ref.Namespace, ref.Name)
	if apierrors.IsNotFound(err) || (err == nil && claim.UID != ref.UID) {
		return nil // gone meanwhile
	}
	if err != nil {
		return fmt.Errorf("get claim %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	name := claim.Namespace + "/" + claim.Name
	if claim.DeletionTimestamp != nil {
		return nil // on its way out
	}
	release, why := r.policy(ctx, claim)
	if !release || claim.Annotations[annSelectedNode] != node {
		if claim.Annotations[annSelectedNode] != node {
			why = fmt.Sprintf("its selected node is %q, not %s, so nothing says it was placed there", claim.Annotations[annSelectedNode], node)
		}
		if r.tell(claim.UID) {
			klog.InfoS("node deleted; its volume's claim is kept", "claim", name, "pv", pv.Name, "node", node, "why", why)
			r.event(ctx, claim, corev1.EventTypeWarning, "NodeDeleted", fmt.Sprintf(
				"node %s was deleted; its volume %s (PV %s) stays bound to this claim (%s), so the claim's pod cannot run until the node is back or the claim is deleted",
				node, pv.Spec.CSI.VolumeHandle, pv.Name, why))
		}
		return nil
	}
	now := time.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q,%q:%q}},"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`,
		AnnReleasedClaim, name, AnnReleasedAt, now, AnnReleasedNode, node)
	if _, err := r.API.Resource(kubeapi.PersistentVolumes).Patch(ctx, pv.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("keep PV %s: %w", pv.Name, err)
	}
	r.event(ctx, claim, corev1.EventTypeWarning, "ReleasedFromDeletedNode", fmt.Sprintf(
		"node %s was deleted: the claim is released (%s) and will be made again with a new, empty volume; the old volume %s stays on that node, its PV %s kept (Retain)",
		node, why, pv.Spec.CSI.VolumeHandle, pv.Name))
	uid := claim.UID
	err = r.API.Resource(kubeapi.PersistentVolumeClaims).Namespace(claim.Namespace).Delete(ctx, claim.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete claim %s: %w", name, err)
	}
	klog.InfoS("released the claim of a deleted node's volume", "claim", name, "pv", pv.Name, "volumeID", pv.Spec.CSI.VolumeHandle, "node", node, "why", why)
	return nil
}

// policy says whether claim is released, and why: its annotation, else
// its class's, else the default.
func (r *Releaser) policy(ctx context.Context, claim *corev1.PersistentVolumeClaim) (bool, string) {
	if v, ok := boolAnn(claim.Annotations); ok {
		return v, fmt.Sprintf("the claim's annotation %s is %v", AnnRelease, v)
	}
	if c := claim.Spec.StorageClassName; c != nil && *c != "" {
		sc, err := kubeapi.Get[storagev1.StorageClass](ctx, r.API, kubeapi.StorageClasses, "", *c)
		if err == nil {
			if v, ok := boolAnn(sc.Annotations); ok {
				return v, fmt.Sprintf("StorageClass %s's annotation %s is %v", *c, AnnRelease, v)
			}
		}
	}
	return r.Default, fmt.Sprintf("the chart's nodeLoss.releaseClaims is %v", r.Default)
}

func boolAnn(a map[string]string) (bool, bool) {
	v, err := strconv.ParseBool(a[AnnRelease])
	return v, err == nil
}

// tell reports whether the claim uid is not yet told it is kept, and
// notes that it now is.
func (r *Releaser) tell(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.told[uid] {
		return false
	}
	if r.told == nil {
		r.told = map[types.UID]bool{}
	}
	r.told[uid] = true
	return true
}

// event records an event on claim; a failure is only logged.
func (r *Releaser) event(ctx context.Context, claim *corev1.PersistentVolumeClaim, typ, reason, msg string) {
	postEvent(ctx, r.API, corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}, typ, reason, msg, component)
}

// postEvent records an event on the object ref (in its namespace, or
// "default" for a cluster-scoped one); a failure is only logged.
func postEvent(ctx context.Context, api dynamic.Interface, ref corev1.ObjectReference, typ, reason, msg, from string) {
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := metav1.Now()
	_, err := kubeapi.Create(ctx, api, kubeapi.Events, ns, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ns},
		InvolvedObject: ref, Reason: reason, Message: msg, Type: typ,
		Source:         corev1.EventSource{Component: from},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	})
	if err != nil {
		klog.ErrorS(err, "event not recorded", "object", ref.Kind+" "+ref.Namespace+"/"+ref.Name, "reason", reason)
	}
}
