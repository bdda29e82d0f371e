package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestServerLatency proves the noisy-neighbour probe reads its own
// volume's latency sum and count from the plugin's metrics, found by the
// name it was created with (the CSI volume ID is not the label's), not
// another volume's, and reports a volume without them as an error.
func TestServerLatency(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, v := range []struct {
			name     string
			sum, cnt float64
		}{{"scale-1", 0.5, 100}, {"scale-10", 9, 9}} {
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_bucket{le=\"0.001\",name=%q,volume_id=\"v1\"} 3\n", v.name)
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_sum{name=%q,namespace=\"\",volume_id=\"v1\"} %g\n", v.name, v.sum)
			fmt.Fprintf(w, "fastblk_volume_io_latency_seconds_count{name=%q,namespace=\"\",volume_id=\"v1\"} %g\n", v.name, v.cnt)
		}
	}))
	defer srv.Close()
	c := scaleConfig{metrics: srv.URL}
	sum, n, err := c.serverLatency(context.Background(), "scale-1")
	if err != nil || sum != 0.5 || n != 100 {
		t.Fatalf("serverLatency(scale-1) = %v, %v, %v; want 0.5, 100", sum, n, err)
	}
	if _, _, err := c.serverLatency(context.Background(), "scale-2"); err == nil {
		t.Fatal("a volume without figures was not an error")
	}
}

// TestGuestBusyTicksGrows reads this machine's /proc/stat: the busy CPU
// time the noisy probe divides by its I/Os is positive and grows while a
// goroutine spins.
func TestGuestBusyTicksGrows(t *testing.T) {
	before, err := guestBusyTicks()
	if err != nil || before <= 0 {
		t.Fatalf("guestBusyTicks = %d, %v", before, err)
	}
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	if after, err := guestBusyTicks(); err != nil || after <= before {
		t.Fatalf("busy ticks %d after 100 ms of spinning, %d before (%v)", after, before, err)
	}
	if got := guestCPU(250, 1000); got != " guest_cpu_us_per_io=2500.00" {
		t.Fatalf("guestCPU(250 ticks, 1000 I/Os) = %q", got)
	}
}
