package peer

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// apiServer is an API server of one namespace's Secrets (GET by name,
// POST, 409 on a second POST of a name) and a fixed pod list, over TLS.
type apiServer struct {
	mu      sync.Mutex
	secrets map[string][]byte
	late    map[string][]byte // made by another plugin just before this one's POST
	posts   int
	deletes int
	pods    string
}

func (a *apiServer) start(t *testing.T) *kubeapi.Client {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		const secrets = "/api/v1/namespaces/csi-fastblk/secrets"
		switch {
		case r.Method == http.MethodPost && r.URL.Path == secrets:
			a.posts++
			body, _ := io.ReadAll(r.Body)
			var s struct {
				Metadata struct{ Name string } `json:"metadata"`
			}
			if json.Unmarshal(body, &s) != nil {
				http.Error(w, "bad body", http.StatusBadRequest)
				return
			}
			if late, ok := a.late[s.Metadata.Name]; ok {
				a.secrets[s.Metadata.Name] = late
			}
			if _, ok := a.secrets[s.Metadata.Name]; ok {
				http.Error(w, "exists", http.StatusConflict)
				return
			}
			a.secrets[s.Metadata.Name] = body
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, secrets+"/"):
			a.deletes++
			delete(a.secrets, r.URL.Path[len(secrets)+1:])
		case r.Method == http.MethodGet && len(r.URL.Path) > len(secrets) && r.URL.Path[:len(secrets)] == secrets:
			body, ok := a.secrets[r.URL.Path[len(secrets)+1:]]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Write(body)
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/csi-fastblk/pods":
			if r.URL.Query().Get("labelSelector") != "app=fastblk" || r.URL.Query().Get("fieldSelector") != "status.phase=Running" {
				http.Error(w, "unexpected query "+r.URL.RawQuery, http.StatusBadRequest)
				return
			}
			io.WriteString(w, a.pods)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := kubeapi.NewClient(srv.URL, "tok", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEnsureCA: the first run of the peer-ca Job makes the CA Secret, of
// its own type; later ones (an upgrade) and the plugins read the same CA;
// a run that loses the race to create it reads the winner's.
func TestEnsureCA(t *testing.T) {
	a := &apiServer{secrets: map[string][]byte{}}
	api := a.start(t)
	ctx := context.Background()
	first, err := EnsureCA(ctx, api, "csi-fastblk", "peer-ca", map[string]string{"app": "fastblk"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsureCA(ctx, api, "csi-fastblk", "peer-ca", nil)
	if err != nil || !again.Cert.Equal(first.Cert) || a.posts != 1 {
		t.Fatalf("second start: %v, same CA %v, %d creates; want the first CA, one create", err, err == nil && again.Cert.Equal(first.Cert), a.posts)
	}

	// The race: the Secret appears between this plugin's GET and POST.
	winner, err := NewCA("winner", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"type": SecretType, "data": map[string][]byte{secretCert: winner.CertPEM, secretKey: winner.KeyPEM}})
	raced := &apiServer{secrets: map[string][]byte{}, late: map[string][]byte{"peer-ca": body}}
	got, err := EnsureCA(ctx, raced.start(t), "csi-fastblk", "peer-ca", nil)
	if err != nil || !got.Cert.Equal(winner.Cert) {
		t.Fatalf("lost race: %v; want the winner's CA", err)
	}

	if plugin, err := ReadCA(ctx, api, "csi-fastblk", "peer-ca"); err != nil || !plugin.Cert.Equal(first.Cert) {
		t.Errorf("a plugin reads %v, %v; want the Job's CA", plugin, err)
	}
	a.secrets["broken"] = []byte(`{"type":"` + SecretType + `","data":{"ca.crt":"bm90IHBlbQ=="}}`)
	if _, err := EnsureCA(ctx, api, "csi-fastblk", "broken", nil); err == nil {
		t.Error("a Secret without a CA: no error")
	}
}

// TestPodResolver: the peer of a tag is the running plugin pod on that
// node, a pod on its way out only when no other runs there.
func TestPodResolver(t *testing.T) {
	a := &apiServer{pods: `{"metadata":{},"items":[
		{"metadata":{"name":"p1"},"spec":{"nodeName":"n1"},"status":{"podIP":"10.0.0.1"}},
		{"metadata":{"name":"p2-old","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"nodeName":"n2"},"status":{"podIP":"10.0.0.2"}},
		{"metadata":{"name":"p2"},"spec":{"nodeName":"n2"},"status":{"podIP":"10.0.0.3"}},
		{"metadata":{"name":"p2-newer-old","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"nodeName":"n2"},"status":{"podIP":"10.0.0.4"}},
		{"metadata":{"name":"p3-pending"},"spec":{"nodeName":"n3"},"status":{}},
		{"metadata":{"name":"p4-old","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"nodeName":"n4"},"status":{"podIP":"10.0.0.5"}}]}`}
	r := &PodResolver{API: a.start(t), Namespace: "csi-fastblk", Selector: "app=fastblk", Port: 9815, Tag: func(n string) string { return "t-" + n }}
	for tag, want := range map[string]Peer{
		"t-n1": {Node: "n1", Addr: "10.0.0.1:9815"},
		"t-n2": {Node: "n2", Addr: "10.0.0.3:9815"},
		"t-n4": {Node: "n4", Addr: "10.0.0.5:9815"},
	} {
		if got, err := r.Resolve(context.Background(), tag); err != nil || got != want {
			t.Errorf("Resolve(%s) = %v, %v; want %v", tag, got, err, want)
		}
	}
	for _, tag := range []string{"t-n3", "n1", "t-n5"} {
		if got, err := r.Resolve(context.Background(), tag); err == nil {
			t.Errorf("Resolve(%s) = %v, want an error", tag, got)
		}
	}
}

// TestPodResolverTagCollision: two nodes whose long names hash to the same
// tag are not told apart by it: Resolve names both and asks neither,
// whichever the API lists first.
func TestPodResolverTagCollision(t *testing.T) {
	for _, order := range [][2]string{{"long-a", "long-b"}, {"long-b", "long-a"}} {
		a := &apiServer{pods: `{"metadata":{},"items":[
			{"metadata":{"name":"p1"},"spec":{"nodeName":"` + order[0] + `"},"status":{"podIP":"10.0.0.1"}},
			{"metadata":{"name":"p2"},"spec":{"nodeName":"` + order[1] + `"},"status":{"podIP":"10.0.0.2"}},
			{"metadata":{"name":"p3"},"spec":{"nodeName":"short"},"status":{"podIP":"10.0.0.3"}}]}`}
		tag := func(n string) string {
			if strings.HasPrefix(n, "long-") {
				return "#12345678"
			}
			return n
		}
		r := &PodResolver{API: a.start(t), Namespace: "csi-fastblk", Selector: "app=fastblk", Port: 9815, Tag: tag}
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
	body, _ := json.Marshal(map[string]any{"type": "Opaque", "data": map[string][]byte{secretCert: planted.CertPEM, secretKey: planted.KeyPEM}})
	a := &apiServer{secrets: map[string][]byte{"peer-ca": body}}
	api := a.start(t)
	ctx := context.Background()
	if ca, err := ReadCA(ctx, api, "csi-fastblk", "peer-ca"); !errors.Is(err, ErrSecretType) {
		t.Fatalf("a plugin reads an Opaque Secret: %v, %v; want ErrSecretType", ca, err)
	}
	made, err := EnsureCA(ctx, api, "csi-fastblk", "peer-ca", nil)
	if err != nil || made.Cert.Equal(planted.Cert) || a.deletes != 1 || a.posts != 1 {
		t.Fatalf("the Job over an Opaque Secret: %v (planted CA kept: %v), %d deletes, %d creates; want a new CA", err, err == nil && made.Cert.Equal(planted.Cert), a.deletes, a.posts)
	}
	if ca, err := ReadCA(ctx, api, "csi-fastblk", "peer-ca"); err != nil || !ca.Cert.Equal(made.Cert) {
		t.Errorf("a plugin after the Job: %v, %v; want the Job's CA", ca, err)
	}
}
