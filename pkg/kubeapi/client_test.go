package kubeapi

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"
)

func fakeAPI() *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{Pods: "PodList", Secrets: "SecretList"})
}

// TestCreateAndGetConvert: Create sends a k8s.io/api object as the API
// server wants it (its apiVersion and kind named, data base64 as JSON
// has it), and Get reads it back into the same type.
func TestCreateAndGetConvert(t *testing.T) {
	api := fakeAPI()
	ctx := context.Background()
	in := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Type: "x/y", Data: map[string][]byte{"k": {0, 1, 2}}}
	if _, err := Create(ctx, api, Secrets, "ns", in); err != nil {
		t.Fatal(err)
	}
	u, err := api.Resource(Secrets).Namespace("ns").Get(ctx, "s", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u.GetAPIVersion() != "v1" || u.GetKind() != "Secret" || u.Object["data"].(map[string]any)["k"] != "AAEC" {
		t.Errorf("created %v", u.Object)
	}
	got, err := Get[corev1.Secret](ctx, api, Secrets, "ns", "s")
	if err != nil || got.Type != "x/y" || string(got.Data["k"]) != "\x00\x01\x02" {
		t.Errorf("Get = %+v, %v", got, err)
	}
	var n int
	err = EachItem(ctx, api, Secrets, metav1.ListOptions{}, func(s *corev1.Secret) error { n++; return nil })
	if err != nil || n != 1 {
		t.Errorf("EachItem: %d, %v", n, err)
	}
}

// TestInformerHoldsTypedObjects: NewInformer's cache holds *T, for the
// listers of client-go (here corev1's), and only the selected objects.
func TestInformerHoldsTypedObjects(t *testing.T) {
	api := fakeAPI()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for name, app := range map[string]string{"a": "fastblk", "b": "other"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": app}}}
		if _, err := Create(ctx, api, Pods, "ns", p); err != nil {
			t.Fatal(err)
		}
	}
	inf := NewInformer[corev1.Pod](api, Pods, "ns", "app=fastblk")
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	items := inf.GetStore().List()
	if len(items) != 1 {
		t.Fatalf("%d pods in the cache, want the one selected", len(items))
	}
	if p, ok := items[0].(*corev1.Pod); !ok || p.Name != "a" {
		t.Errorf("cache holds %T %v, want *v1.Pod a", items[0], items[0])
	}
}
