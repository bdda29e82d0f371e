// Package peertest fakes the Kubernetes API server for tests of the peer
// channel and of its authorization: client-go's fake dynamic client
// (which the plugin's client is), holding k8s.io/api objects, whose
// TokenReviews answer for the tokens the test names. It is for tests only.
package peertest

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubescheme "k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Token is what the API server knows of a token: a projected token of
// ServiceAccount in Namespace for Audience, bound to the pod Pod (UID) on
// Node. An Expired token is refused as the API server refuses one.
type Token struct {
	Audience, Namespace, ServiceAccount string
	Node, Pod, UID                      string
	Expired                             bool
	// Exp is the expiry its JWT says (JWT); zero: in 2100, or for an
	// Expired token in 2000.
	Exp time.Time
}

// JWT is tok as the kubelet's projected token carries it: a JWT whose
// claims say what tok says (audience, expiry, and the pod, node and
// service account under "kubernetes.io"), signed by no one. The same
// Token gives the same JWT for its Exp.
func JWT(tok Token) string {
	exp := tok.Exp
	if exp.IsZero() {
		exp = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
		if tok.Expired {
			exp = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
		}
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	const issued = 1577836800 // 2020-01-01
	type named struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	}
	claims := map[string]any{
		"aud": []string{tok.Audience}, "exp": exp.Unix(), "iat": issued, "nbf": issued,
		"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:" + tok.Namespace + ":" + tok.ServiceAccount,
		"kubernetes.io": map[string]any{"namespace": tok.Namespace, "node": named{tok.Node, "node-uid"},
			"pod": named{tok.Pod, tok.UID}, "serviceaccount": named{tok.ServiceAccount, "sa-uid"}},
	}
	return enc(map[string]string{"alg": "RS256", "kid": "peertest"}) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString([]byte("signed by no one"))
}

// Mint makes the API server know the JWT of tok, and returns it.
func (a *API) Mint(tok Token) string {
	s := JWT(tok)
	a.SetToken(s, tok)
	return s
}

// API holds the objects of a fake API server and the tokens it knows.
// Client is the plugin's client of it.
type API struct {
	Client *dynamicfake.FakeDynamicClient

	mu     sync.Mutex
	tokens map[string]Token
}

// New returns an API without objects or tokens.
func New() *API {
	a := &API{tokens: map[string]Token{}}
	// An empty scheme: the fake holds every object unstructured, as the
	// dynamic client sees them (kubescheme only names their kinds in Put).
	a.Client = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kubeapi.Pods:                   "PodList",
		kubeapi.Events:                 "EventList",
		kubeapi.VolumeSnapshots:        "VolumeSnapshotList",
		kubeapi.VolumeSnapshotContents: "VolumeSnapshotContentList",
	})
	a.Client.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		u := action.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured)
		var tr authnv1.TokenReview
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tr); err != nil {
			return true, nil, err
		}
		tr.Status = a.review(tr.Spec.Token, tr.Spec.Audiences)
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tr)
		return true, &unstructured.Unstructured{Object: m}, err
	})
	return a
}

// SetToken makes the API server know token as tok.
func (a *API) SetToken(token string, tok Token) {
	a.mu.Lock()
	a.tokens[token] = tok
	a.mu.Unlock()
}

// Put creates obj, or replaces the object of its name: a k8s.io/api
// object, or an unstructured one of the snapshot CRDs.
func (a *API) Put(t testing.TB, obj runtime.Object) {
	t.Helper()
	u, gvr := unstructuredOf(t, obj)
	tracker := a.Client.Tracker()
	if _, err := tracker.Get(gvr, u.GetNamespace(), u.GetName()); apierrors.IsNotFound(err) {
		if err := tracker.Create(gvr, u, u.GetNamespace()); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := tracker.Update(gvr, u, u.GetNamespace()); err != nil {
		t.Fatal(err)
	}
}

// Remove deletes obj's object.
func (a *API) Remove(t testing.TB, obj runtime.Object) {
	t.Helper()
	u, gvr := unstructuredOf(t, obj)
	if err := a.Client.Tracker().Delete(gvr, u.GetNamespace(), u.GetName()); err != nil {
		t.Fatal(err)
	}
}

// unstructuredOf is obj as the dynamic client holds it, and its resource.
func unstructuredOf(t testing.TB, obj runtime.Object) (*unstructured.Unstructured, schema.GroupVersionResource) {
	t.Helper()
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		gvks, _, err := kubescheme.Scheme.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			t.Fatal(err)
		}
		u = &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(gvks[0])
	}
	gvr, _ := meta.UnsafeGuessKindToResource(u.GroupVersionKind())
	return u, gvr
}

// Calls counts the calls of verb on resource the client made.
func (a *API) Calls(verb, resource string) int {
	n := 0
	for _, act := range a.Client.Actions() {
		if act.GetVerb() == verb && act.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// review is the status of a TokenReview of token for audiences, as the
// API server answers it.
func (a *API) review(token string, audiences []string) authnv1.TokenReviewStatus {
	a.mu.Lock()
	tok, ok := a.tokens[token]
	a.mu.Unlock()
	switch {
	case !ok:
		return authnv1.TokenReviewStatus{Error: "invalid bearer token"}
	case tok.Expired:
		return authnv1.TokenReviewStatus{Error: "invalid bearer token, service account token has expired"}
	case !slices.Contains(audiences, tok.Audience):
		return authnv1.TokenReviewStatus{Error: "invalid bearer token, token audiences are invalid"}
	}
	return authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{tok.Audience}, User: authnv1.UserInfo{
		Username: "system:serviceaccount:" + tok.Namespace + ":" + tok.ServiceAccount,
		Extra: map[string]authnv1.ExtraValue{
			"authentication.kubernetes.io/node-name": {tok.Node},
			"authentication.kubernetes.io/pod-name":  {tok.Pod},
			"authentication.kubernetes.io/pod-uid":   {tok.UID},
		},
	}}
}

// Pod is a running pod in namespace.
func Pod(namespace, name, uid, node, serviceAccount, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid), Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: serviceAccount},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}
