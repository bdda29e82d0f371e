package nodereport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Reporter reports one node's backend and its refusals. Set its fields,
// then call Start.
type Reporter struct {
	API dynamic.Interface
	// Driver is the CSI driver's name, the prefix of the Node's label and
	// annotation; Node is this node's name.
	Driver, Node string
	// Every is the least time between two reports of one refusal (zero:
	// 10 minutes): the provisioner asks for each StorageClass's capacity
	// every minute.
	Every time.Duration
	// MaxClaims bounds the pending claims one refusal is reported on
	// (zero: 20).
	MaxClaims int

	ctx  context.Context
	mu   sync.Mutex
	sent map[string]time.Time // refusal key -> when last reported
}

// Start makes r report until ctx ends.
func (r *Reporter) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx = ctx
	r.sent = map[string]time.Time{}
}

// BackendLabel is the Node label that names the node's backend.
func BackendLabel(driver string) string { return driver + "/backend" }

// ReasonAnnotation is the Node annotation that says why the node serves
// loop where ublk was asked for (absent when it does not).
func ReasonAnnotation(driver string) string { return driver + "/backend-reason" }

// Backend reports the node's backend (ublk or loop) and, when it fell
// back to loop, reason (a fallback's short cause, as the metric's label)
// and why: the Node's label and annotation, and for a fallback a Warning
// event on the Node. It returns at once; the patch is retried in the
// background until it is made or r's context ends.
func (r *Reporter) Backend(backend, reason, why string) {
	ann := any(nil) // a merge patch's null removes the annotation
	if reason != "" {
		ann = reason + ": " + why
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{BackendLabel(r.Driver): backend},
		"annotations": map[string]any{ReasonAnnotation(r.Driver): ann},
	}})
	go func() {
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			node, err := r.patchNode(patch)
			if err == nil {
				klog.InfoS("node labelled with its backend", "node", r.Node, "label", BackendLabel(r.Driver)+"="+backend, "reason", reason)
				if reason != "" {
					r.event(ref("Node", "", node.Name, node.UID), corev1.EventTypeWarning, "BackendFallback",
						fmt.Sprintf("serving volumes with loop devices, not ublk (%s): %s", reason, why))
				}
				return
			}
			klog.ErrorS(err, "label the node with its backend; retrying", "node", r.Node, "in", wait)
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}()
}

func (r *Reporter) patchNode(patch []byte) (*corev1.Node, error) {
	u, err := r.API.Resource(kubeapi.Nodes).Patch(r.ctx, r.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "csi-fastblk"})
	if err != nil {
		return nil, err
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), UID: u.GetUID()}}, nil
}

// NoCapacity reports why this node gives the StorageClasses whose
// parameters are params no capacity: a Warning event on each of them and
// on their pending claims. One refusal is reported at most once per
// Every; the reporting runs in the background. It is the driver's
// NoCapacityReporter.
func (r *Reporter) NoCapacity(params map[string]string, why string) {
	key := refusalKey(params, why)
	r.mu.Lock()
	if r.ctx == nil || time.Since(r.sent[key]) < r.every() {
		r.mu.Unlock()
		return
	}
	r.sent[key] = time.Now()
	r.mu.Unlock()
	go func() {
		if err := r.reportNoCapacity(params, why); err != nil {
			klog.ErrorS(err, "report a StorageClass without capacity on this node", "parameters", params, "reason", why)
			r.mu.Lock()
			delete(r.sent, key) // try again at the next refusal
			r.mu.Unlock()
		}
	}()
}

func (r *Reporter) every() time.Duration {
	if r.Every > 0 {
		return r.Every
	}
	return 10 * time.Minute
}

// refusalKey names one refusal: the class's parameters and why.
func refusalKey(params map[string]string, why string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(params)) {
		fmt.Fprintf(h, "%q=%q\n", k, params[k])
	}
	h.Write([]byte(why))
	return hex.EncodeToString(h.Sum(nil))
}

func (r *Reporter) reportNoCapacity(params map[string]string, why string) error {
	var classes []*storagev1.StorageClass
	err := kubeapi.EachItem(r.ctx, r.API, kubeapi.StorageClasses, metav1.ListOptions{ResourceVersion: "0"}, func(sc *storagev1.StorageClass) error {
		if sc.Provisioner == r.Driver && maps.Equal(sc.Parameters, params) {
			classes = append(classes, sc)
		}
		return nil
	})
	if err != nil || len(classes) == 0 {
		return err
	}
	names := map[string]bool{}
	for _, sc := range classes {
		names[sc.Name] = true
		r.event(ref("StorageClass", "", sc.Name, sc.UID), corev1.EventTypeWarning, "NoCapacity",
			fmt.Sprintf("node %s offers no capacity for this StorageClass: %s", r.Node, why))
	}
	max := r.MaxClaims
	if max <= 0 {
		max = 20
	}
	n := 0
	return kubeapi.EachItem(r.ctx, r.API, kubeapi.PersistentVolumeClaims, metav1.ListOptions{ResourceVersion: "0"}, func(c *corev1.PersistentVolumeClaim) error {
		sc := c.Spec.StorageClassName
		if sc == nil || !names[*sc] || c.Status.Phase != corev1.ClaimPending || n >= max {
			return nil
		}
		n++
		r.event(ref("PersistentVolumeClaim", c.Namespace, c.Name, c.UID), corev1.EventTypeWarning, "NoCapacity",
			fmt.Sprintf("node %s offers no capacity for StorageClass %s: %s", r.Node, *sc, why))
		return nil
	})
}

func ref(kind, ns, name string, uid types.UID) corev1.ObjectReference {
	apiVersion := "v1"
	if kind == "StorageClass" {
		apiVersion = "storage.k8s.io/v1"
	}
	return corev1.ObjectReference{APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name, UID: uid}
}

// event posts an event about obj (in its namespace, or "default" for a
// cluster-scoped object, as the kubelet posts a Node's); a failure is
// logged.
func (r *Reporter) event(obj corev1.ObjectReference, typ, reason, msg string) {
	ns := obj.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", strings.ToLower(obj.Name), time.Now().UnixNano()), Namespace: ns},
		InvolvedObject: obj,
		Reason:         reason,
		Message:        msg,
		Type:           typ,
		Source:         corev1.EventSource{Component: "csi-fastblk", Host: r.Node},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if _, err := kubeapi.Create(r.ctx, r.API, kubeapi.Events, ns, ev); err != nil {
		klog.ErrorS(err, "post an event", "kind", obj.Kind, "name", obj.Name, "reason", reason)
	}
}
