package driver

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// A failing readiness check (the kubelet's registration) makes the plugin
// unhealthy with a summary that says so, and Probe answer "not ready"
// rather than an error, which sidecars would treat as fatal.
func TestReadinessCheck(t *testing.T) {
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	notRegistered := errors.New("not registered")
	var err error = notRegistered
	n.d.AddReadinessCheck("kubelet", func(context.Context) error { return err })

	herr := n.d.Healthy(ctx)
	if !errors.Is(herr, notRegistered) {
		t.Fatalf("Healthy = %v, want the readiness check's error", herr)
	}
	if got, want := HealthSummary(herr), "kubelet: not registered"; got != want {
		t.Errorf("HealthSummary = %q, want %q", got, want)
	}
	id := &Identity{d: n.d}
	resp, perr := id.Probe(ctx, &csi.ProbeRequest{})
	if perr != nil || resp.GetReady().GetValue() {
		t.Errorf("Probe while not registered = %v, %v; want Ready false and no error", resp, perr)
	}

	err = nil
	if herr := n.d.Healthy(ctx); herr != nil {
		t.Fatalf("Healthy once registered = %v", herr)
	}
	resp, perr = id.Probe(ctx, &csi.ProbeRequest{})
	if perr != nil || !resp.GetReady().GetValue() {
		t.Errorf("Probe once registered = %v, %v; want Ready true", resp, perr)
	}
}
