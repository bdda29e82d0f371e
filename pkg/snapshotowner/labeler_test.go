package snapshotowner

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// contentServer serves VolumeSnapshotContents as the API server does for
// the calls Once makes: a LIST with a label selector "!<key>" (the only
// form it needs), and a JSON merge patch of one content's labels, which
// answers 404 for a content that is gone.
type contentServer struct {
	mu       sync.Mutex
	contents map[string]map[string]any
	patches  []string
}

func (s *contentServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	name, one := strings.CutPrefix(r.URL.Path, contentsPath+"/")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == contentsPath:
		sel := r.URL.Query().Get("labelSelector")
		key, ok := strings.CutPrefix(sel, "!")
		if !ok {
			http.Error(w, "unexpected selector "+sel, http.StatusBadRequest)
			return
		}
		var items []map[string]any
		for _, n := range slices.Sorted(maps.Keys(s.contents)) {
			c := s.contents[n]
			if _, has := labels(c)[key]; !has {
				items = append(items, c)
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"kind": "VolumeSnapshotContentList", "metadata": map[string]any{}, "items": items})
	case r.Method == http.MethodPatch && one:
		if ct := r.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
			return
		}
		c, ok := s.contents[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		l := labels(c)
		for k, v := range p.Metadata.Labels {
			l[k] = v
		}
		s.patches = append(s.patches, name)
		json.NewEncoder(w).Encode(c)
	default:
		http.Error(w, r.Method+" "+r.URL.Path, http.StatusMethodNotAllowed)
	}
}

func labels(c map[string]any) map[string]any {
	md := c["metadata"].(map[string]any)
	l, _ := md["labels"].(map[string]any)
	if l == nil {
		l = map[string]any{}
		md["labels"] = l
	}
	return l
}

func vsc(name, driver, snapshotHandle, volumeHandle string, lbls map[string]any) map[string]any {
	src := map[string]any{}
	if snapshotHandle != "" {
		src["snapshotHandle"] = snapshotHandle
	}
	if volumeHandle != "" {
		src["volumeHandle"] = volumeHandle
	}
	return map[string]any{"metadata": map[string]any{"name": name, "labels": lbls},
		"spec": map[string]any{"driver": driver, "source": src, "deletionPolicy": "Retain"}}
}

// TestOnceLabelsThisNodesHandMadeContents: of the contents without the
// label, only the hand-made ones (snapshotHandle) of this driver whose
// handle this node holds get managed-by: <node>; another node's, another
// driver's, a dynamic one and an already labelled one are left alone; a
// content deleted before its patch is skipped; a second pass labels
// nothing. Before, nothing labelled them and the suite's pre-provisioned
// snapshot specs never became ready.
func TestOnceLabelsThisNodesHandMadeContents(t *testing.T) {
	srv := &contentServer{contents: map[string]map[string]any{
		"mine":         vsc("mine", "fastblk.csi.io", "s1-n1", "", nil),
		"other-node":   vsc("other-node", "fastblk.csi.io", "s2-n2", "", nil),
		"other-driver": vsc("other-driver", "other.csi.io", "s1-n1", "", nil),
		"dynamic":      vsc("dynamic", "fastblk.csi.io", "", "v1-n1", nil),
		"labelled":     vsc("labelled", "fastblk.csi.io", "s3-n1", "", map[string]any{ManagedBy: "n9"}),
	}}
	ts := httptest.NewTLSServer(srv)
	t.Cleanup(ts.Close)
	api, err := kubeapi.NewClient(ts.URL, "tok", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	holds := func(h string) bool {
		if h == "s9-n1" { // deleted between the list and the patch
			srv.mu.Lock()
			delete(srv.contents, "gone")
			srv.mu.Unlock()
		}
		return strings.HasSuffix(h, "-n1")
	}
	srv.contents["gone"] = vsc("gone", "fastblk.csi.io", "s9-n1", "", nil)
	l := &Labeler{API: api, Driver: "fastblk.csi.io", Node: "n1", Holds: holds}

	got, err := l.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"mine"}) {
		t.Errorf("labelled %q, want [mine]", got)
	}
	if v := labels(srv.contents["mine"])[ManagedBy]; v != "n1" {
		t.Errorf("mine's %s = %v, want n1", ManagedBy, v)
	}
	if v := labels(srv.contents["labelled"])[ManagedBy]; v != "n9" {
		t.Errorf("an already labelled content was relabelled %v", v)
	}
	for _, n := range []string{"other-node", "other-driver", "dynamic"} {
		if _, has := labels(srv.contents[n])[ManagedBy]; has {
			t.Errorf("%s was labelled", n)
		}
	}
	again, err := l.Once(context.Background())
	if err != nil || len(again) != 0 {
		t.Errorf("second pass labelled %q (%v), want nothing", again, err)
	}
}
