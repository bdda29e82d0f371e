package plugin

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/test/internal/iogap"
)

// stallRounds is how many restarts the stall tests measure
// (FASTBLK_STALL_ROUNDS, default 5).
func stallRounds(t *testing.T) int {
	if s := os.Getenv("FASTBLK_STALL_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FASTBLK_STALL_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return 5
}

// TestUpgradeStall measures what a plugin upgrade does to a volume in use
// on the loop backend: a writer does 4 KiB O_DIRECT writes one at a time
// on a published raw block volume while the plugin is stopped with
// SIGTERM (as the kubelet stops the old pod) and started again on the same
// data directory (the new pod, its image pulled), and the longest gap
// between two completed writes is the stall. Loop devices are served by
// the kernel, so the plugin's absence must not stall them: the worst gap
// must stay under a second, and the figures are logged (docs/upgrades.md).
func TestUpgradeStall(t *testing.T) {
	testgate.RequireRoot(t)
	bin, dir := buildBinary(t), t.TempDir()
	p := launch(t, bin, dir)
	capBlock := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	id, staging, target := p.provision(t, "stall-vol", 64<<20, capBlock, "dev")
	m, err := iogap.Start(target, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	var gaps, restarts []time.Duration
	for range stallRounds(t) {
		m.Reset()
		t0 := time.Now()
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.exited:
			if err != nil {
				t.Fatalf("plugin exit after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("plugin did not stop within 30s of SIGTERM")
		}
		p = launch(t, bin, dir)
		waitReady(t, p)
		restarts = append(restarts, time.Since(t0))
		w := m.Writes()
		waitFor(t, "writes after the restart", func() bool { return m.Writes() > w+10 })
		gap, err := m.Max()
		if err != nil {
			t.Fatal(err)
		}
		gaps = append(gaps, gap)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	gmed, gworst := iogap.Summary(gaps)
	rmed, rworst := iogap.Summary(restarts)
	t.Logf("loop backend, %d restarts: I/O stall median %.3f s, worst %.3f s; plugin stop to ready median %.3f s, worst %.3f s",
		len(gaps), gmed, gworst, rmed, rworst)
	if gworst >= 1 {
		t.Errorf("worst I/O stall %.3f s across a plugin restart on loop devices, want < 1 s (gaps %v)", gworst, gaps)
	}
	p.release(t, id, staging, target)
}

// waitReady waits until the plugin's Probe says ready.
func waitReady(t *testing.T, p *runningPlugin) {
	t.Helper()
	id := csi.NewIdentityClient(p.conn)
	waitFor(t, "plugin ready", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := id.Probe(ctx, &csi.ProbeRequest{})
		return err == nil && (r.GetReady() == nil || r.GetReady().GetValue())
	})
}
