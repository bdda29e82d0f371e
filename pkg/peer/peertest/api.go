// Package peertest is a fake Kubernetes API server for tests of the peer
// channel: TokenReviews of the tokens it is told of, and GETs of the
// objects it holds as JSON. It is for tests only.
package peertest

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Token is what the API server knows of a token: a projected token of
// ServiceAccount in Namespace for Audience, bound to the pod Pod (UID) on
// Node. An Expired token is refused as the API server refuses one.
type Token struct {
	Audience, Namespace, ServiceAccount string
	Node, Pod, UID                      string
	Expired                             bool
}

// API serves TokenReviews and GETs over TLS. Its fields may be changed
// between calls under Lock.
type API struct {
	sync.Mutex
	Tokens  map[string]Token
	Objects map[string]string // by path: the JSON a GET answers
	Reviews int               // TokenReviews asked
	Gets    map[string]int    // GETs by path
}

// New returns an empty API.
func New() *API {
	return &API{Tokens: map[string]Token{}, Objects: map[string]string{}, Gets: map[string]int{}}
}

// Set puts obj (marshalled to JSON) at path.
func (a *API) Set(path string, obj any) {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	a.Lock()
	a.Objects[path] = string(b)
	a.Unlock()
}

// Start serves a until the test ends and returns a client of it.
func (a *API) Start(t testing.TB) *kubeapi.Client {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(srv.Close)
	c, err := kubeapi.NewClient(srv.URL, "tok", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.Lock()
	defer a.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
		a.Reviews++
		var tr struct {
			Spec struct {
				Token     string   `json:"token"`
				Audiences []string `json:"audiences"`
			} `json:"spec"`
		}
		body, _ := io.ReadAll(r.Body)
		if json.Unmarshal(body, &tr) != nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"status": a.review(tr.Spec.Token, tr.Spec.Audiences)})
	case r.Method == http.MethodGet:
		a.Gets[r.URL.Path]++
		body, ok := a.Objects[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, body)
	default:
		http.NotFound(w, r)
	}
}

// review is the status of a TokenReview of token for audiences, as the
// API server answers it.
func (a *API) review(token string, audiences []string) map[string]any {
	tok, ok := a.Tokens[token]
	switch {
	case !ok:
		return map[string]any{"authenticated": false, "error": "invalid bearer token"}
	case tok.Expired:
		return map[string]any{"authenticated": false, "error": "invalid bearer token, service account token has expired"}
	case !slices.Contains(audiences, tok.Audience):
		return map[string]any{"authenticated": false, "error": "invalid bearer token, token audiences are invalid"}
	}
	return map[string]any{"authenticated": true, "audiences": []string{tok.Audience}, "user": map[string]any{
		"username": "system:serviceaccount:" + tok.Namespace + ":" + tok.ServiceAccount,
		"extra": map[string][]string{
			"authentication.kubernetes.io/node-name": {tok.Node},
			"authentication.kubernetes.io/pod-name":  {tok.Pod},
			"authentication.kubernetes.io/pod-uid":   {tok.UID},
		},
	}}
}

// Pod is a pod as the API server answers a GET of it.
func Pod(name, uid, node, serviceAccount, ip string, labels map[string]string) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": name, "uid": uid, "labels": labels},
		"spec":     map[string]any{"nodeName": node, "serviceAccountName": serviceAccount},
		"status":   map[string]any{"podIP": ip, "podIPs": []map[string]string{{"ip": ip}}},
	}
}
