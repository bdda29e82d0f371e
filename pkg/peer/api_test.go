package peer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

// caSecret is a Secret of typ holding ca.
func caSecret(name string, typ corev1.SecretType, ca *CA) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "csi-fastblk", Name: name}, Type: typ,
		Data: map[string][]byte{secretCert: ca.CertPEM, secretKey: ca.KeyPEM}}
}

// TestEnsureCA: the first run of the peer-ca Job makes the CA Secret, of
// its own type; later ones (an upgrade) and the plugins read the same CA;
// a run that loses the race to create it reads the winner's.
func TestEnsureCA(t *testing.T) {
	api := peertest.New()
	ctx := context.Background()
	first, err := EnsureCA(ctx, api.Client, "csi-fastblk", "peer-ca", map[string]string{"app": "fastblk"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsureCA(ctx, api.Client, "csi-fastblk", "peer-ca", nil)
	if creates := api.Calls("create", "secrets"); err != nil || !again.Cert.Equal(first.Cert) || creates != 1 {
		t.Fatalf("second start: %v, same CA %v, %d creates; want the first CA, one create", err, err == nil && again.Cert.Equal(first.Cert), creates)
	}
	s, err := kubeapi.Get[corev1.Secret](ctx, api.Client, kubeapi.Secrets, "csi-fastblk", "peer-ca")
	if err != nil || s.Type != SecretType || s.Labels["app"] != "fastblk" {
		t.Errorf("the CA Secret: %v; want type %s and the labels", err, SecretType)
	}

	// The race: the Secret appears between this run's GET and its create.
	winner, err := NewCA("winner", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raced := peertest.New()
	raced.Client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		raced.Put(t, caSecret("peer-ca", SecretType, winner))
		return false, nil, nil // the create goes on, and finds it
	})
	got, err := EnsureCA(ctx, raced.Client, "csi-fastblk", "peer-ca", nil)
	if err != nil || !got.Cert.Equal(winner.Cert) {
		t.Fatalf("lost race: %v; want the winner's CA", err)
	}

	if plugin, err := ReadCA(ctx, api.Client, "csi-fastblk", "peer-ca"); err != nil || !plugin.Cert.Equal(first.Cert) {
		t.Errorf("a plugin reads %v, %v; want the Job's CA", plugin, err)
	}
	api.Put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "csi-fastblk", Name: "broken"}, Type: SecretType,
		Data: map[string][]byte{secretCert: []byte("not pem")}})
	if _, err := EnsureCA(ctx, api.Client, "csi-fastblk", "broken", nil); err == nil {
		t.Error("a Secret without a CA: no error")
	}
}

// resolverPod is a plugin pod (label app=fastblk) on node.
func resolverPod(name, node, ip string, phase corev1.PodPhase, leaving bool) *corev1.Pod {
	p := peertest.Pod("csi-fastblk", name, "uid-"+name, node, "csi-fastblk-node", ip, map[string]string{"app": "fastblk"})
	p.Status.Phase = phase
	if ip == "" {
		p.Status.PodIPs = nil
	}
	if leaving {
		p.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	return p
}

// startResolver starts a resolver of api's plugin pods until the test
// ends.
func startResolver(t *testing.T, api *peertest.API, tag func(string) string) *PodResolver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := NewPodResolver(api.Client, "csi-fastblk", "app=fastblk", 9815, tag)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPodResolver: the peer of a tag is the running plugin pod on that
// node, a pod on its way out only when no other runs there; pods of
// other namespaces or without the installation's labels are not peers.
func TestPodResolver(t *testing.T) {
	api := peertest.New()
	for _, p := range []*corev1.Pod{
		resolverPod("p1", "n1", "10.0.0.1", corev1.PodRunning, false),
		resolverPod("p2-old", "n2", "10.0.0.2", corev1.PodRunning, true),
		resolverPod("p2", "n2", "10.0.0.3", corev1.PodRunning, false),
		resolverPod("p2-newer-old", "n2", "10.0.0.4", corev1.PodRunning, true),
		resolverPod("p3-pending", "n3", "", corev1.PodPending, false),
		resolverPod("p4-old", "n4", "10.0.0.5", corev1.PodRunning, true),
		resolverPod("p5-done", "n5", "10.0.0.6", corev1.PodSucceeded, false),
	} {
		api.Put(t, p)
	}
	stranger := resolverPod("app", "n6", "10.0.0.7", corev1.PodRunning, false)
	stranger.Labels = map[string]string{"app": "shop"}
	api.Put(t, stranger)
	elsewhere := resolverPod("p7", "n7", "10.0.0.8", corev1.PodRunning, false)
	elsewhere.Namespace = "other"
	api.Put(t, elsewhere)

	r := startResolver(t, api, func(n string) string { return "t-" + n })
	for tag, want := range map[string]Peer{
		"t-n1": {Node: "n1", Addr: "10.0.0.1:9815"},
		"t-n2": {Node: "n2", Addr: "10.0.0.3:9815"},
		"t-n4": {Node: "n4", Addr: "10.0.0.5:9815"},
	} {
		if got, err := r.Resolve(context.Background(), tag); err != nil || got != want {
			t.Errorf("Resolve(%s) = %v, %v; want %v", tag, got, err, want)
		}
	}
	for _, tag := range []string{"t-n3", "n1", "t-n5", "t-n6", "t-n7", "t-n8"} {
		if got, err := r.Resolve(context.Background(), tag); err == nil {
			t.Errorf("Resolve(%s) = %v, want an error", tag, got)
		}
	}
}

// TestPodResolverWatches: the resolver follows the pods as they come and
// go, from its watch alone: a pod started after it is found, a pod
// deleted is no longer, and no call lists pods again.
func TestPodResolverWatches(t *testing.T) {
	api := peertest.New()
	r := startResolver(t, api, func(n string) string { return n })
	lists := api.Calls("list", "pods")
	resolves := func(node string, want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := r.Resolve(context.Background(), node)
			if (err == nil) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Resolve(%s): %v; want found %v", node, err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	p := resolverPod("p1", "n1", "10.0.0.1", corev1.PodRunning, false)
	resolves("n1", false)
	api.Put(t, p)
	resolves("n1", true)
	if got := r.Pod("p1"); got == nil || got.Spec.NodeName != "n1" {
		t.Errorf("Pod(p1) = %v, want the pod on n1", got)
	}
	api.Remove(t, p)
	resolves("n1", false)
	if got := api.Calls("list", "pods"); got != lists {
		t.Errorf("%d lists of pods after the first, want none", got-lists)
	}
}

// TestPodResolverTagCollision: two nodes whose long names hash to the same
// tag are not told apart by it: Resolve names both and asks neither,
// whichever the watch brought first.
func TestPodResolverTagCollision(t *testing.T) {
	for _, order := range [][2]string{{"long-a", "long-b"}, {"long-b", "long-a"}} {
		api := peertest.New()
		api.Put(t, resolverPod("p1", order[0], "10.0.0.1", corev1.PodRunning, false))
		api.Put(t, resolverPod("p2", order[1], "10.0.0.2", corev1.PodRunning, false))
		api.Put(t, resolverPod("p3", "short", "10.0.0.3", corev1.PodRunning, false))
		tag := func(n string) string {
			if strings.HasPrefix(n, "long-") {
				return "#12345678"
			}
			return n
		}
		r := startResolver(t, api, tag)
		got, err := r.Resolve(context.Background(), "#12345678")
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "long-a, long-b") {
			t.Errorf("Resolve of a tag of nodes %v = %v, %v; want FailedPrecondition naming both", order, got, err)
		}
		if got, err := r.Resolve(context.Background(), "short"); err != nil || got.Node != "short" {
			t.Errorf("Resolve(short) = %v, %v", got, err)
		}
	}
}

// TestCASecretType: a plugin takes no Secret of another type for the CA
// (an Opaque one planted under the name by an account that may create
// Secrets, or made by plugins before); the Job replaces such a Secret
// with a CA of its own.
func TestCASecretType(t *testing.T) {
	planted, err := NewCA("planted", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	api := peertest.New()
	api.Put(t, caSecret("peer-ca", corev1.SecretTypeOpaque, planted))
	ctx := context.Background()
	if ca, err := ReadCA(ctx, api.Client, "csi-fastblk", "peer-ca"); !errors.Is(err, ErrSecretType) {
		t.Fatalf("a plugin reads an Opaque Secret: %v, %v; want ErrSecretType", ca, err)
	}
	made, err := EnsureCA(ctx, api.Client, "csi-fastblk", "peer-ca", nil)
	deletes, creates := api.Calls("delete", "secrets"), api.Calls("create", "secrets")
	if err != nil || made.Cert.Equal(planted.Cert) || deletes != 1 || creates != 1 {
		t.Fatalf("the Job over an Opaque Secret: %v (planted CA kept: %v), %d deletes, %d creates; want a new CA", err, err == nil && made.Cert.Equal(planted.Cert), deletes, creates)
	}
	if ca, err := ReadCA(ctx, api.Client, "csi-fastblk", "peer-ca"); err != nil || !ca.Cert.Equal(made.Cert) {
		t.Errorf("a plugin after the Job: %v, %v; want the Job's CA", ca, err)
	}
}
