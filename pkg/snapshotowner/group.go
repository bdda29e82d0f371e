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

// ClassSince annotates a VolumeGroupSnapshotClass with when its
// managed-by label was last set (RFC 3339).
const ClassSince = "fastblk.csi.io/managed-by-since"

// How long a node keeps a class it took: at least classMinHold (so that
// its contents, labelled just after, are seen by the others before they
// may take it back), at most classMaxHold while another node waits (a
// group that fails for ever is retried by its csi-snapshotter for ever,
// and must not keep the class from the other nodes).
const (
	classMinHold = 5 * time.Second
	classMaxHold = time.Minute
)

// Groups labels this node's group snapshot objects for its
// csi-snapshotter: the VolumeGroupSnapshotContents whose first volume (or,
// made by hand, whose group) is this node's, and their classes in turn
// (see the package comment). A content whose group is still to be made
// needs its class (the sidecar reads its parameters), so it is labelled
// only once its class names this node; any other is labelled at once.
type Groups struct {
	API    dynamic.Interface
	Driver string // the CSI driver name, spec.driver of our objects
	Node   string // this node's name, the label's value
	// HoldsVolume and HoldsGroup report whether a volume handle or a
	// group snapshot handle is one of this node's.
	HoldsVolume, HoldsGroup func(handle string) bool

	now func() time.Time // time.Now, but in tests
}

// groupObjects are the watched objects of one pass, our driver's only.
type groupObjects struct {
	contents []*unstructured.Unstructured
	classes  map[string]*unstructured.Unstructured // by name
}

func (g *Groups) list(contents, classes cache.GenericLister) (groupObjects, error) {
	objs := groupObjects{classes: map[string]*unstructured.Unstructured{}}
	// A content names its driver in its spec, a class at its top.
	for _, l := range []struct {
		lister cache.GenericLister
		driver []string
		add    func(*unstructured.Unstructured)
	}{
		{contents, []string{"spec", "driver"}, func(u *unstructured.Unstructured) { objs.contents = append(objs.contents, u) }},
		{classes, []string{"driver"}, func(u *unstructured.Unstructured) { objs.classes[u.GetName()] = u }},
	} {
		all, err := l.lister.List(labels.Everything())
		if err != nil {
			return objs, err
		}
		for _, obj := range all {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				if driver, _, _ := unstructured.NestedString(u.Object, l.driver...); driver == g.Driver {
					l.add(u)
				}
			}
		}
	}
	return objs, nil
}

// str is the string at spec.<path> of u ("" when absent).
func str(u *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, append([]string{"spec"}, path...)...)
	return s
}

// mine reports whether the group content c is this node's: its first
// volume is, or (made by hand) its group is.
func (g *Groups) mine(c *unstructured.Unstructured) bool {
	if vols, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "source", "volumeHandles"); len(vols) > 0 {
		return g.HoldsVolume(vols[0])
	}
	h := str(c, "source", "groupSnapshotHandles", "volumeGroupSnapshotHandle")
	return h != "" && g.HoldsGroup(h)
}

// needsClass reports whether the csi-snapshotter still reads c's class:
// its group is not made (or, made by hand, not checked) yet.
func needsClass(c *unstructured.Unstructured) bool {
	made, _, _ := unstructured.NestedString(c.Object, "status", "volumeGroupSnapshotHandle")
	return str(c, "volumeGroupSnapshotClassName") != "" && made == "" && c.GetDeletionTimestamp() == nil
}

// waits reports whether the content c waits for its class to name node.
func (o groupObjects) waits(c *unstructured.Unstructured, node string) bool {
	class := o.classes[str(c, "volumeGroupSnapshotClassName")]
	return needsClass(c) && class != nil && class.GetLabels()[ManagedBy] != node
}

// busy reports whether node's csi-snapshotter is making a group of the
// class: a content labelled for node still needs it.
func (o groupObjects) busy(node, class string) bool {
	for _, c := range o.contents {
		if c.GetLabels()[ManagedBy] == node && str(c, "volumeGroupSnapshotClassName") == class && needsClass(c) {
			return true
		}
	}
	return false
}

// free reports whether this node may take the class: no node has it,
// its node has made its groups and held it classMinHold, or it has held it
// classMaxHold.
func (g *Groups) free(o groupObjects, class *unstructured.Unstructured) bool {
	holder := class.GetLabels()[ManagedBy]
	if holder == "" {
		return true
	}
	since, err := time.Parse(time.RFC3339Nano, class.GetAnnotations()[ClassSince])
	held := g.now().Sub(since)
	return err != nil || held >= classMaxHold || (held >= classMinHold && !o.busy(holder, class.GetName()))
}

// once does one pass over the watched objects: it takes the classes this
// node's contents wait for that are free, then labels this node's
// contents that do not wait. It returns what it took and labelled.
func (g *Groups) once(ctx context.Context, contents, classes cache.GenericLister) (took, labelled []string, err error) {
	o, err := g.list(contents, classes)
	if err != nil {
		return nil, nil, err
	}
	var mine []*unstructured.Unstructured
	for _, c := range o.contents {
		if g.mine(c) && (c.GetLabels()[ManagedBy] == "" || c.GetLabels()[ManagedBy] == g.Node) {
			mine = append(mine, c)
		}
	}
	for _, c := range mine {
		class := o.classes[str(c, "volumeGroupSnapshotClassName")]
		if !o.waits(c, g.Node) || !g.free(o, class) {
			continue
		}
		patched, err := g.label(ctx, kubeapi.VolumeGroupSnapshotClasses, class, true)
		if err != nil {
			return took, labelled, err
		}
		if patched != nil { // else another node took it first
			o.classes[class.GetName()] = patched
			took = append(took, class.GetName())
		}
	}
	for _, c := range mine {
		if c.GetLabels()[ManagedBy] != "" || o.waits(c, g.Node) {
			continue
		}
		patched, err := g.label(ctx, kubeapi.VolumeGroupSnapshotContents, c, false)
		if err != nil {
			return took, labelled, err
		}
		if patched != nil {
			labelled = append(labelled, c.GetName())
		}
	}
	return took, labelled, nil
}

// label gives obj the managed-by label with this node, and for a class
// the time, on the condition that obj is unchanged since it was read
// (its resourceVersion). It returns the object patched, nil when it
// changed or went meanwhile.
func (g *Groups) label(ctx context.Context, r schema.GroupVersionResource, obj *unstructured.Unstructured, since bool) (*unstructured.Unstructured, error) {
	meta := map[string]any{"resourceVersion": obj.GetResourceVersion(), "labels": map[string]string{ManagedBy: g.Node}}
	if since {
		meta["annotations"] = map[string]string{ClassSince: g.now().UTC().Format(time.RFC3339Nano)}
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	out, err := g.API.Resource(r).Patch(ctx, obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("label %s %s: %w", r.Resource, obj.GetName(), err)
	}
	return out, nil
}

// Run labels until ctx ends: at every change of a group content or class,
// and every period (classes change hands with time). It waits for the
// group snapshot CRDs, and logs what it takes and labels, and an error
// when it first appears.
func (g *Groups) Run(ctx context.Context, every time.Duration) {
	if g.now == nil {
		g.now = time.Now
	}
	if !waitForResource(ctx, g.API, kubeapi.VolumeGroupSnapshotContents, "", every) {
		return
	}
	changed := make(chan struct{}, 1)
	contents, err := watchAll(ctx, g.API, kubeapi.VolumeGroupSnapshotContents, "", changed)
	var classes cache.GenericLister
	if err == nil {
		classes, err = watchAll(ctx, g.API, kubeapi.VolumeGroupSnapshotClasses, "", changed)
	}
	if err != nil {
		if ctx.Err() == nil {
			klog.ErrorS(err, "labelling group snapshot objects: not started")
		}
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		took, labelled, err := g.once(ctx, contents, classes)
		for _, name := range took {
			klog.InfoS("took a VolumeGroupSnapshotClass for this node's csi-snapshotter", "class", name, "label", ManagedBy, "node", g.Node)
		}
		for _, name := range labelled {
			klog.InfoS("labelled a VolumeGroupSnapshotContent for this node's csi-snapshotter", "content", name, "label", ManagedBy, "node", g.Node)
		}
		switch {
		case err == nil || ctx.Err() != nil:
			last = ""
		case err.Error() != last:
			last = err.Error()
			klog.ErrorS(err, "labelling group snapshot objects; retrying", "every", every)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}
