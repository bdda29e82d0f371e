package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestCommSampleFindsEveryProcessOfACommand proves the reference column's
// CPU is summed over every process of the daemon's command name, read from
// the real /proc: two sleeps of a name no other process has are both
// counted, and a name nothing runs under counts nothing.
func TestCommSampleFindsEveryProcessOfACommand(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fastblk-refcomm")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	if err := os.Symlink(sleep, bin); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		cmd := exec.Command(bin, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	var f procFigures
	for end := time.Now().Add(5 * time.Second); f.threads < 2 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if f, err = commSample("fastblk-refcomm"); err != nil {
			t.Fatal(err)
		}
	}
	if f.threads != 2 || f.rssKiB <= 0 {
		t.Fatalf("commSample(fastblk-refcomm) = %+v; want 2 threads and some memory", f)
	}
	if f, err := commSample("no-such-command"); err != nil || f != (procFigures{}) {
		t.Fatalf("commSample(no-such-command) = %+v, %v; want nothing", f, err)
	}
}

// TestRefModeNeedsItsServer proves --mode ref without the reference
// server's command is refused with a clear error before anything is made.
func TestRefModeNeedsItsServer(t *testing.T) {
	err := runBenchScale(context.Background(), []string{"--mode", "ref", "--dir", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--ref-ublk") {
		t.Fatalf("--mode ref without --ref-ublk: %v; want an error naming --ref-ublk", err)
	}
}
