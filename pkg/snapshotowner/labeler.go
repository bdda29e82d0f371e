package snapshotowner

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// ManagedBy is the label by which a node's csi-snapshotter picks its
// VolumeSnapshotContents.
const ManagedBy = "snapshot.storage.kubernetes.io/managed-by"

// unlabelled selects the contents no node's csi-snapshotter has yet: the
// only ones the labeler watches, so that the API server sends each node
// the few contents made by hand and not the cluster's every snapshot.
const unlabelled = "!" + ManagedBy

// GroupMember is the annotation the snapshot-controller gives each
// VolumeSnapshotContent it makes for a member of a group snapshot: the
// group's handle.
const GroupMember = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle"

// Labeler labels this node's unlabelled pre-provisioned contents, and the
// contents of the members of this node's group snapshots.
type Labeler struct {
	API    dynamic.Interface
	Driver string // the CSI driver name, spec.driver of our contents
	Node   string // this node's name, the label's value
	// Holds reports whether a snapshot handle is one of this node's.
	Holds func(handle string) bool
	// HoldsGroup reports whether a group snapshot handle is one of this
	// node's (nil: members are not labelled).
	HoldsGroup func(handle string) bool
}

// watchAll starts a watch of resource's objects that selector selects,
// which runs until ctx ends. It returns their cache, once filled; changed
// is sent to (without blocking) when one is added or changed.
func watchAll(ctx context.Context, api dynamic.Interface, resource schema.GroupVersionResource, selector string, changed chan<- struct{}) (cache.GenericLister, error) {
	inf := kubeapi.NewInformer[unstructured.Unstructured](api, resource, "", selector)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, obj any) { poke(obj) },
	}); err != nil {
		return nil, err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watch %s: %w", resource.Resource, ctx.Err())
	}
	return cache.NewGenericLister(inf.GetIndexer(), resource.GroupResource()), nil
}

// once labels every content of the cache without the label whose driver
// is ours and that is this node's (ours), and returns their names. A
// content deleted meanwhile is skipped.
func (l *Labeler) once(ctx context.Context, contents cache.GenericLister) ([]string, error) {
	objs, err := contents.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{ManagedBy: l.Node}}})
	var labelled []string
	for _, obj := range objs {
		c, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		drv, _, _ := unstructured.NestedString(c.Object, "spec", "driver")
		if drv != l.Driver || c.GetLabels()[ManagedBy] != "" || !l.ours(c) {
			continue
		}
		_, err := l.API.Resource(kubeapi.VolumeSnapshotContents).Patch(ctx, c.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return labelled, fmt.Errorf("label VolumeSnapshotContent %s: %w", c.GetName(), err)
		}
		labelled = append(labelled, c.GetName())
	}
	return labelled, nil
}

// ours reports whether this node's csi-snapshotter must handle c and
// nothing labels it: a content made by hand (a snapshot handle) of a
// snapshot this node holds, or the content of a member of a group
// snapshot this node holds. The snapshot-controller makes a member's
// content with its volume handle and status and labels none; the sidecar
// has nothing to do for it but let it go when the group is deleted (it
// removes the finalizer), which it does only for contents it sees.
func (l *Labeler) ours(c *unstructured.Unstructured) bool {
	if h, _, _ := unstructured.NestedString(c.Object, "spec", "source", "snapshotHandle"); h != "" {
		return l.Holds(h)
	}
	g := c.GetAnnotations()[GroupMember]
	return g != "" && l.HoldsGroup != nil && l.HoldsGroup(g)
}

// Run labels this node's contents until ctx ends: each as the watch
// brings it, and every period over the watch's cache (for a content whose
// snapshot this node came to hold after it was made). It waits for the
// snapshot CRDs (a cluster without them is not an error), logs what it
// labels, and an error when it first appears (RBAC without the right to
// patch, an API server away), then tries again.
func (l *Labeler) Run(ctx context.Context, every time.Duration) {
	if !waitForResource(ctx, l.API, kubeapi.VolumeSnapshotContents, unlabelled, every) {
		return
	}
	changed := make(chan struct{}, 1)
	contents, err := watchAll(ctx, l.API, kubeapi.VolumeSnapshotContents, unlabelled, changed)
	if err != nil {
		if ctx.Err() == nil {
			klog.ErrorS(err, "labelling pre-provisioned snapshot contents: not started")
		}
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		labelled, err := l.once(ctx, contents)
		for _, name := range labelled {
			klog.InfoS("labelled a snapshot content for this node's csi-snapshotter", "content", name, "label", ManagedBy, "node", l.Node)
		}
		switch {
		case err == nil || ctx.Err() != nil:
			last = ""
		case err.Error() != last:
			last = err.Error()
			klog.ErrorS(err, "labelling snapshot contents; retrying", "every", every)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// waitForResource returns once the API server serves resource (its CRD
// is installed), asking every period (false when ctx ends first). A watch
// started before would log its failures over and over.
func waitForResource(ctx context.Context, api dynamic.Interface, resource schema.GroupVersionResource, selector string, every time.Duration) bool {
	last := ""
	for {
		_, err := api.Resource(resource).List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: 1})
		switch {
		case err == nil:
			return true
		case ctx.Err() != nil:
			return false
		case apierrors.IsNotFound(err):
		case err.Error() != last:
			last = err.Error()
			klog.ErrorS(err, "cannot list "+resource.Resource+"; retrying", "every", every)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(every):
		}
	}
}
