package e2e

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/test/internal/iogap"
)

// TestUpgradeStall measures what a plugin upgrade does to a ublk volume in
// use: a writer does 4 KiB O_DIRECT writes one at a time on the device
// while the plugin stops on SIGTERM (its devices stay, quiesced, their I/O
// held) and starts again on the same data directory, re-adopting them
// (user recovery). The longest gap between two completed writes is the
// stall; FASTBLK_STALL_ROUNDS restarts (default 5) give its median and
// worst (docs/upgrades.md). No write may fail.
func TestUpgradeStall(t *testing.T) {
	p := newPlugin(t)
	restartStall(t, p, "SIGTERM", p.stop)
}

// TestCrashStall is TestUpgradeStall with kill -9 instead of SIGTERM: the
// plugin dies with its rings open, as in an OOM kill.
func TestCrashStall(t *testing.T) {
	p := newPlugin(t)
	restartStall(t, p, "kill -9", p.kill9)
}

func restartStall(t *testing.T, p *plugin, how string, stop func()) {
	v := p.provision("stall", 64<<20, blockCap(), nil)
	m, err := iogap.Start(p.devLink(v), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	rounds := 5
	if s := os.Getenv("FASTBLK_STALL_ROUNDS"); s != "" {
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("FASTBLK_STALL_ROUNDS=%q: want a positive number", s)
		}
	}
	var gaps, stops, starts []time.Duration
	for i := range rounds {
		m.Reset()
		t0 := time.Now()
		stop()
		t1 := time.Now()
		p.start()
		stops, starts = append(stops, t1.Sub(t0)), append(starts, time.Since(t1))
		w := m.Writes()
		deadline := time.Now().Add(30 * time.Second)
		for m.Writes() <= w+10 {
			if time.Now().After(deadline) {
				t.Fatalf("%s restart %d of %d: no writes completed within 30 s: the device was not re-adopted\n%s", how, i+1, rounds, p.logTail())
			}
			time.Sleep(10 * time.Millisecond)
		}
		gap, err := m.Max()
		if err != nil {
			t.Fatalf("write across the restart: %v\n%s", err, p.logTail())
		}
		gaps = append(gaps, gap)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	gmed, gworst := iogap.Summary(gaps)
	smed, sworst := iogap.Summary(stops)
	rmed, rworst := iogap.Summary(starts)
	t.Logf("ublk backend, %d restarts after %s: I/O stall median %.3f s, worst %.3f s (gaps %v); stop median %.3f s, worst %.3f s; start to ready median %.3f s, worst %.3f s",
		len(gaps), how, gmed, gworst, gaps, smed, sworst, rmed, rworst)
	if n := p.metric(`fastblk_volume_recoveries_total{device_class="default",name="stall",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="` + v.storeID() + `"}`); n != 1 {
		t.Errorf("recoveries = %v after the last restart, want 1", n)
	}
}
