package kubeapi

import (
	"context"
	"fmt"
	"reflect"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	storagev1beta1 "k8s.io/api/storage/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/client-go/util/flowcontrol"
)

// ServiceAccountDir is where the kubelet mounts a pod's service account
// token, namespace and the cluster's CA.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// The resources the plugin reads or writes.
var (
	Pods                    = corev1.SchemeGroupVersion.WithResource("pods")
	Nodes                   = corev1.SchemeGroupVersion.WithResource("nodes")
	Events                  = corev1.SchemeGroupVersion.WithResource("events")
	StorageClasses          = storagev1.SchemeGroupVersion.WithResource("storageclasses")
	Secrets                 = corev1.SchemeGroupVersion.WithResource("secrets")
	PersistentVolumes       = corev1.SchemeGroupVersion.WithResource("persistentvolumes")
	PersistentVolumeClaims  = corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	TokenReviews            = authnv1.SchemeGroupVersion.WithResource("tokenreviews")
	CSIDrivers              = storagev1.SchemeGroupVersion.WithResource("csidrivers")
	VolumeAttachments       = storagev1.SchemeGroupVersion.WithResource("volumeattachments")
	VolumeAttributesClasses = storagev1.SchemeGroupVersion.WithResource("volumeattributesclasses")
	// A cluster that serves VolumeAttributesClasses only as beta.
	VolumeAttributesClassesBeta = storagev1beta1.SchemeGroupVersion.WithResource("volumeattributesclasses")
	VolumeSnapshots             = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotContents      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	VolumeGroupSnapshotContents = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
	VolumeGroupSnapshotClasses  = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
)

// Client-side rate limits. A plugin's calls are few (a peer's token
// review, a claim read per forwarded call, watches); these keep a burst of
// them, or a loop gone wrong, from weighing on the API server. client-go
// also backs off on 429 and honours Retry-After.
const (
	qps   = 20
	burst = 40
)

// InCluster returns a client of the cluster the pod runs in, from the
// environment the kubelet sets and the service account files it mounts.
// client-go reads the token file again every minute, so a projected token
// the kubelet renews is used before the one it replaces expires.
func InCluster(component string) (dynamic.Interface, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes API: %w", err)
	}
	return New(cfg, component)
}

// New returns a client of the API server cfg names; component names the
// part of the plugin in the User-Agent (in the API server's audit log).
//
// It is client-go's dynamic client, for every resource: the typed
// clients register every API group's types (kubernetes/scheme), which
// made the plugin's binary 27 MB larger; the dynamic client carries none,
// and Get, Create, EachItem and NewInformer convert to and from the few
// k8s.io/api types the plugin uses.
func New(cfg *rest.Config, component string) (dynamic.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "csi-fastblk/" + component
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes API: %w", err)
	}
	return c, nil
}

// Get reads the object ns/name (ns "" for a cluster-scoped one) of
// resource into a T, its k8s.io/api type. A missing object's error
// satisfies apierrors.IsNotFound.
func Get[T any](ctx context.Context, api dynamic.Interface, resource schema.GroupVersionResource, ns, name string) (*T, error) {
	u, err := api.Resource(resource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return convert[T](u)
}

// Create creates obj (a T of k8s.io/api) in ns and returns the API
// server's answer: the object made, or for a review its status.
func Create[T any](ctx context.Context, api dynamic.Interface, resource schema.GroupVersionResource, ns string, obj *T) (*T, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", resource.Resource, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(resource.GroupVersion().String())
	u.SetKind(reflect.TypeFor[T]().Name())
	out, err := api.Resource(resource).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return convert[T](out)
}

// EachItem calls fn with every object of resource that opts selects, read
// in pages of 500.
func EachItem[T any](ctx context.Context, api dynamic.Interface, resource schema.GroupVersionResource, opts metav1.ListOptions, fn func(*T) error) error {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return api.Resource(resource).List(ctx, opts)
	})
	return p.EachListItem(ctx, opts, func(obj runtime.Object) error {
		t, err := convert[T](obj.(*unstructured.Unstructured))
		if err != nil {
			return err
		}
		return fn(t)
	})
}

// NewInformer returns an informer of the objects of resource in ns ("" for
// all) that the label selector selects: one list, then a watch, kept in
// its cache as *T.
func NewInformer[T any](api dynamic.Interface, resource schema.GroupVersionResource, ns, selector string) cache.SharedIndexInformer {
	r := api.Resource(resource).Namespace(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return r.Watch(ctx, o)
		},
	}
	// The wrapper tells the informer whether the client streams its
	// first list (the API server does; client-go's fakes do not).
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, api), &unstructured.Unstructured{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// Only before the informer runs can this fail.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			return convert[T](u)
		}
		return obj, nil // a tombstone
	})
	return inf
}

func convert[T any](u *unstructured.Unstructured) (*T, error) {
	var t T
	if same, ok := any(&t).(*unstructured.Unstructured); ok { // nothing to convert
		*same = *u
		return &t, nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
		return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return &t, nil
}
