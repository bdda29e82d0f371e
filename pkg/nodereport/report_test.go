package nodereport

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

const drv = "fastblk.csi.io"

func fakeAPI(t *testing.T, objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	t.Helper()
	api := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kubeapi.Nodes: "NodeList", kubeapi.Events: "EventList", kubeapi.StorageClasses: "StorageClassList",
		kubeapi.PersistentVolumeClaims: "PersistentVolumeClaimList",
	})
	for _, o := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		var gvr schema.GroupVersionResource
		switch o.(type) {
		case *corev1.Node:
			gvr, u.Object["apiVersion"], u.Object["kind"] = kubeapi.Nodes, "v1", "Node"
		case *storagev1.StorageClass:
			gvr, u.Object["apiVersion"], u.Object["kind"] = kubeapi.StorageClasses, "storage.k8s.io/v1", "StorageClass"
		case *corev1.PersistentVolumeClaim:
			gvr, u.Object["apiVersion"], u.Object["kind"] = kubeapi.PersistentVolumeClaims, "v1", "PersistentVolumeClaim"
		}
		if _, err := api.Resource(gvr).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return api
}

func events(t *testing.T, api *dynamicfake.FakeDynamicClient) []corev1.Event {
	t.Helper()
	var out []corev1.Event
	err := kubeapi.EachItem(context.Background(), api, kubeapi.Events, metav1.ListOptions{}, func(e *corev1.Event) error {
		out = append(out, *e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestBackendLabelsTheNode: a fallback labels the node loop, annotates
// why and posts a Warning event on it; a later ublk start relabels it and
// removes the annotation.
func TestBackendLabelsTheNode(t *testing.T) {
	api := fakeAPI(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1", Labels: map[string]string{"keep": "me"}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Reporter{API: api, Driver: drv, Node: "n1"}
	r.Start(ctx)
	node := func() *corev1.Node {
		n, err := kubeapi.Get[corev1.Node](ctx, api, kubeapi.Nodes, "", "n1")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	r.Backend("loop", "ublk_absent", "kernel 6.1 has no ublk_drv")
	waitFor(t, "the label and the event", func() bool { return node().Labels[BackendLabel(drv)] == "loop" && len(events(t, api)) == 1 })
	n := node()
	if got := n.Annotations[ReasonAnnotation(drv)]; got != "ublk_absent: kernel 6.1 has no ublk_drv" || n.Labels["keep"] != "me" {
		t.Errorf("node after a fallback: labels %v, annotations %v", n.Labels, n.Annotations)
	}
	ev := events(t, api)[0]
	if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "n1" || ev.InvolvedObject.UID != "uid-n1" || ev.Type != corev1.EventTypeWarning ||
		ev.Reason != "BackendFallback" || !strings.Contains(ev.Message, "kernel 6.1 has no ublk_drv") || ev.Namespace != "default" {
		t.Errorf("event %+v", ev)
	}
	r.Backend("ublk", "", "")
	waitFor(t, "the ublk label", func() bool { return node().Labels[BackendLabel(drv)] == "ublk" })
	if a, ok := node().Annotations[ReasonAnnotation(drv)]; ok {
		t.Errorf("the reason annotation %q stays after ublk started", a)
	}
	if n := len(events(t, api)); n != 1 {
		t.Errorf("%d events after ublk started, want still 1 (a start on ublk is no warning)", n)
	}
}

// TestNoCapacityTellsClassAndPendingClaims: a refusal is reported on each
// of the driver's StorageClasses with those parameters and on their
// pending claims only, and not again within Every.
func TestNoCapacityTellsClassAndPendingClaims(t *testing.T) {
	capped := map[string]string{"maxIOPS": "1000"}
	sc := func(name, prov string, params map[string]string) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, UID: k8stypes.UID("uid-" + name)}, Provisioner: prov, Parameters: params}
	}
	claim := func(ns, name, class string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
	}
	api := fakeAPI(t, sc("capped", drv, capped), sc("plain", drv, nil), sc("other-driver", "other.csi.io", capped),
		claim("apps", "waiting", "capped", corev1.ClaimPending), claim("apps", "bound", "capped", corev1.ClaimBound),
		claim("apps", "plain", "plain", corev1.ClaimPending))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Reporter{API: api, Driver: drv, Node: "n1"}
	r.Start(ctx)
	why := "rate limits (maxIOPS, maxBandwidth) need the ublk backend; this node serves volumes with loop"
	r.NoCapacity(map[string]string{"maxIOPS": "1000"}, why)
	waitFor(t, "two events", func() bool { return len(events(t, api)) == 2 })
	got := map[string]corev1.Event{}
	for _, e := range events(t, api) {
		got[e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name] = e
	}
	for _, k := range []string{"StorageClass/capped", "PersistentVolumeClaim/waiting"} {
		e, ok := got[k]
		if !ok || e.Reason != "NoCapacity" || !strings.Contains(e.Message, "node n1 offers no capacity") || !strings.Contains(e.Message, why) {
			t.Errorf("%s: event %+v (have %v)", k, e, got)
		}
	}
	if e := got["PersistentVolumeClaim/waiting"]; e.Namespace != "apps" {
		t.Errorf("the claim's event is in namespace %q, want apps", e.Namespace)
	}
	r.NoCapacity(map[string]string{"maxIOPS": "1000"}, why)
	time.Sleep(100 * time.Millisecond) // nothing may come: no condition to poll for
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events after the same refusal again, want 2 (once per Every)", n)
	}
}
