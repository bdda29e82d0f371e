package uninstall

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// apiServer answers the two list calls of Check as the Kubernetes API
// does: JSON lists, pages joined by metadata.continue, 401 without the
// token, and 403 for volumeattachments when forbid is set.
func apiServer(t *testing.T, forbid bool) (*httptest.Server, []byte) {
	pages := map[string][]string{
		"/api/v1/persistentvolumes": {
			`{"apiVersion":"v1","kind":"PersistentVolumeList","metadata":{"continue":"p2"},"items":[
			  {"metadata":{"name":"pvc-1"},"spec":{"csi":{"driver":"fastblk.csi.io"},"claimRef":{"namespace":"apps","name":"data"},
			   "persistentVolumeReclaimPolicy":"Delete","nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[
			   {"key":"topology.fastblk.csi.io/node","operator":"In","values":["n1"]}]}]}}},"status":{"phase":"Bound"}},
			  {"metadata":{"name":"nfs-1"},"spec":{"nfs":{"server":"x"}},"status":{"phase":"Bound"}}]}`,
			`{"apiVersion":"v1","kind":"PersistentVolumeList","metadata":{},"items":[
			  {"metadata":{"name":"other"},"spec":{"csi":{"driver":"other.csi.io"}},"status":{"phase":"Bound"}},
			  {"metadata":{"name":"pvc-2"},"spec":{"csi":{"driver":"fastblk.csi.io"},"persistentVolumeReclaimPolicy":"Retain"},"status":{"phase":"Released"}}]}`,
		},
		"/apis/storage.k8s.io/v1/volumeattachments": {
			`{"apiVersion":"storage.k8s.io/v1","kind":"VolumeAttachmentList","metadata":{},"items":[
			  {"metadata":{"name":"csi-a"},"spec":{"attacher":"fastblk.csi.io","nodeName":"n1","source":{"persistentVolumeName":"pvc-1"}},"status":{"attached":true}},
			  {"metadata":{"name":"csi-b"},"spec":{"attacher":"other.csi.io","nodeName":"n2","source":{"persistentVolumeName":"other"}}}]}`,
		},
	}
	csiDrivers := map[string]string{
		"/apis/storage.k8s.io/v1/csidrivers/fastblk.csi.io": `{"apiVersion":"storage.k8s.io/v1","kind":"CSIDriver","metadata":{"name":"fastblk.csi.io",
		  "annotations":{"fastblk.csi.io/allow-uninstall-with-volumes":"true"}}}`,
		"/apis/storage.k8s.io/v1/csidrivers/plain.csi.io": `{"apiVersion":"storage.k8s.io/v1","kind":"CSIDriver","metadata":{"name":"plain.csi.io",
		  "annotations":{"fastblk.csi.io/allow-uninstall-with-volumes":"yes please"}}}`,
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
		if forbid && strings.Contains(r.URL.Path, "volumeattachments") {
			writeStatus(w, http.StatusForbidden, "Forbidden", `volumeattachments.storage.k8s.io is forbidden: User "system:serviceaccount:csi-fastblk:uninstall" cannot list resource "volumeattachments"`)
			return
		}
		if d, ok := csiDrivers[r.URL.Path]; ok {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(d))
			return
		}
		p, ok := pages[r.URL.Path]
		if !ok || r.URL.Query().Get("limit") == "" {
			http.NotFound(w, r)
			return
		}
		i := 0
		if r.URL.Query().Get("continue") == "p2" {
			i = 1
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(p[i]))
	}))
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv, ca
}

// writeStatus answers an error as the API server does: a Status object.
func writeStatus(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":%q,"message":%q,"code":%d}`, reason, message, code)
}

// client is the plugin's client of srv with token, trusting ca.
func client(t *testing.T, srv *httptest.Server, token string, ca []byte) dynamic.Interface {
	t.Helper()
	c, err := kubeapi.New(&rest.Config{Host: srv.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckListsTheDriversObjects(t *testing.T) {
	srv, ca := apiServer(t, false)
	c := client(t, srv, "tok", ca)
	r, err := Check(context.Background(), c, "fastblk.csi.io")
	if err != nil {
		t.Fatal(err)
	}
	if !r.InUse() || len(r.Volumes) != 2 || len(r.Attachments) != 1 {
		t.Fatalf("report %+v: want pvc-1 and pvc-2 (both pages) and csi-a", r)
	}
	want := Volume{Name: "pvc-1", Claim: "apps/data", Phase: "Bound", Node: "n1", ReclaimPolicy: "Delete"}
	if r.Volumes[0] != want || r.Volumes[1].Name != "pvc-2" || r.Volumes[1].Claim != "" {
		t.Errorf("volumes %+v, want %+v first", r.Volumes, want)
	}
	if a := r.Attachments[0]; a != (Attachment{Name: "csi-a", Volume: "pvc-1", Node: "n1", Attached: true}) {
		t.Errorf("attachment %+v", a)
	}
	var out bytes.Buffer
	r.Write(&out)
	for _, s := range []string{"2 PersistentVolumes and 1 VolumeAttachments of fastblk.csi.io", "pv pvc-1  claim apps/data  phase Bound  node n1", "pv pvc-2  claim -"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report lacks %q:\n%s", s, out.String())
		}
	}

	none, err := Check(context.Background(), c, "unused.csi.io")
	if err != nil || none.InUse() {
		t.Errorf("driver without objects: %+v, %v", none, err)
	}
}

// TestAllowedReadsTheCSIDriversAnnotation: only "true" in the annotation of
// the driver's own CSIDriver allows; a missing CSIDriver does not; an API
// error is an error.
func TestAllowedReadsTheCSIDriversAnnotation(t *testing.T) {
	srv, ca := apiServer(t, false)
	c := client(t, srv, "tok", ca)
	for driver, want := range map[string]bool{"fastblk.csi.io": true, "plain.csi.io": false, "gone.csi.io": false} {
		got, err := Allowed(context.Background(), c, driver)
		if err != nil || got != want {
			t.Errorf("Allowed(%s) = %v, %v; want %v", driver, got, err, want)
		}
	}
	bad := client(t, srv, "nope", ca)
	if _, err := Allowed(context.Background(), bad, "fastblk.csi.io"); !apierrors.IsUnauthorized(err) || !strings.Contains(err.Error(), "CSIDriver fastblk.csi.io") {
		t.Errorf("Allowed with a bad token: %v, want 401", err)
	}
}

// TestCheckFailsClearly: an API error (missing RBAC, bad token, wrong CA)
// is an error naming the call, never an empty report.
func TestCheckFailsClearly(t *testing.T) {
	srv, ca := apiServer(t, true)
	for _, tc := range []struct {
		name, token string
		ca          []byte
		want        string
	}{
		{"forbidden", "tok", ca, "list VolumeAttachments: volumeattachments.storage.k8s.io is forbidden"},
		{"bad token", "nope", ca, "list PersistentVolumes: Unauthorized"},
		{"wrong CA", "tok", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherCert(t)}), "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := client(t, srv, tc.token, tc.ca)
			if _, err := Check(context.Background(), c, "fastblk.csi.io"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// otherCert is a self-signed certificate that did not sign the server's.
func otherCert(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
