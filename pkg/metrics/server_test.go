package metrics

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/driver"
)

// TestHandlerKeepsStatusOff proves the network-facing handler serves
// /metrics and /healthz but not /status (volume names and paths) unless
// asked to, and that the local handler serves /status alone.
func TestHandlerKeepsStatusOff(t *testing.T) {
	st := fixedStatus(driver.NodeStatus{Healthy: true, Volumes: []driver.VolumeStatus{{ID: "v1", Name: "pvc-secret"}}})
	for _, tc := range []struct {
		name string
		h    http.Handler
		want map[string]int
	}{
		{"network", Handler(st, Startup{}, false), map[string]int{"/metrics": 200, "/healthz": 200, "/status": 404}},
		{"network exposing status", Handler(st, Startup{}, true), map[string]int{"/metrics": 200, "/healthz": 200, "/status": 200}},
		{"local", StatusHandler(st), map[string]int{"/metrics": 404, "/healthz": 404, "/status": 200}},
	} {
		for path, code := range tc.want {
			rec := httptest.NewRecorder()
			tc.h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			if rec.Code != code {
				t.Errorf("%s: GET %s = %d, want %d", tc.name, path, rec.Code, code)
			}
		}
	}
}

// TestServerTimeouts proves the servers bound how long a client may take
// to send its request and read the answer, and how long an idle
// connection stays.
func TestServerTimeouts(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(lis, StatusHandler(fixedStatus(driver.NodeStatus{})))
	defer s.Close()
	h := s.srv
	if h.ReadHeaderTimeout <= 0 || h.ReadTimeout <= 0 || h.WriteTimeout <= 0 || h.IdleTimeout <= 0 || h.MaxHeaderBytes <= 0 {
		t.Errorf("server limits: header %v read %v write %v idle %v max header %d; want all set",
			h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout, h.IdleTimeout, h.MaxHeaderBytes)
	}
	resp, err := http.Get("http://" + s.Addr() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /status = %s", resp.Status)
	}
}
