package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestServerLatency proves the noisy-neighbour probe reads its own
// volume's latency sum and count from the plugin's metrics, not another
// volume's, and reports a volume without them as an error.
func TestServerLatency(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, v := range []struct {
			id       string
			sum, cnt float64
		}{{"vol-1", 0.5, 100}, {"vol-10", 9, 9}} {
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_bucket{name=\"\",volume_id=%q,le=\"0.001\"} 3\n", v.id)
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_sum{name=\"\",volume_id=%q} %g\n", v.id, v.sum)
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_count{name=\"\",volume_id=%q} %g\n", v.id, v.cnt)
		}
	}))
	defer srv.Close()
	c := scaleConfig{metrics: srv.URL}
	sum, n, err := c.serverLatency(context.Background(), "vol-1")
	if err != nil || sum != 0.5 || n != 100 {
		t.Fatalf("serverLatency(vol-1) = %v, %v, %v; want 0.5, 100", sum, n, err)
	}
	if _, _, err := c.serverLatency(context.Background(), "vol-2"); err == nil {
		t.Fatal("a volume without figures was not an error")
	}
}
