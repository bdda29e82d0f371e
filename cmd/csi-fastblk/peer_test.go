package main

import (
	"context"
	"flag"
	"io"
	"maps"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// TestPeerFlags: the peer channel is off without --peer-address; on, it
// needs its identity flags (the token's file and audience among them),
// and the selector, which a peer's pod must match, is equality-only.
func TestPeerFlags(t *testing.T) {
	parse := func(args ...string) (*serveConfig, error) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return cfg, cfg.peer.check()
	}
	if cfg, err := parse(); err != nil || cfg.peer.address != "" {
		t.Errorf("no peer flags: %v, %q; want the channel off", err, cfg.peer.address)
	}
	full := []string{"--peer-address=:9815", "--peer-namespace=ns", "--peer-service-account=sa", "--peer-ca-secret=ca",
		"--peer-token-file=/var/run/secrets/fastblk.csi.io/peer/token", "--peer-token-audience=peer.fastblk.csi.io/ns/x", "--peer-selector=app=a,component=node"}
	if _, err := parse(full...); err != nil {
		t.Errorf("full peer flags: %v", err)
	}
	if _, err := parse(full[:3]...); err == nil {
		t.Error("--peer-address without the CA secret and selector: no error")
	}
	if _, err := parse(append(full[:4:4], full[6])...); err == nil {
		t.Error("--peer-address without the token's file and audience: no error")
	}
	for _, sel := range []string{"app!=a", "app in (a)", "app", "=a", "app=a,,b=c"} {
		if _, err := parse(append(full[:6:6], "--peer-selector="+sel)...); err == nil {
			t.Errorf("--peer-selector=%s: no error", sel)
		}
	}
	cfg, err := parse(full...)
	if want := (peer.Limits{MaxStreams: 16, MaxStreamsPerPeer: 4, MinRate: 1 << 20}); err != nil || cfg.peer.limits != want {
		t.Errorf("default limits: %+v, %v; want %+v", cfg.peer.limits, err, want)
	}
	cfg, err = parse(append(full, "--peer-max-streams=8", "--peer-max-streams-per-peer=2", "--peer-min-rate=4Mi", "--peer-serve-data=false")...)
	if want := (peer.Limits{MaxStreams: 8, MaxStreamsPerPeer: 2, MinRate: 4 << 20, RefuseData: true}); err != nil || cfg.peer.limits != want {
		t.Errorf("limits: %+v, %v; want %+v", cfg.peer.limits, err, want)
	}
	if cfg, err = parse(full...); err != nil || cfg.peer.serveMetadata {
		t.Errorf("default --peer-serve-metadata: %v, %v; want off", cfg.peer.serveMetadata, err)
	}
	if cfg, err = parse(append(full, "--peer-serve-metadata")...); err != nil || !cfg.peer.serveMetadata {
		t.Errorf("--peer-serve-metadata: %v, %v; want on", cfg.peer.serveMetadata, err)
	}
	if cfg, err = parse(full...); err != nil || cfg.peer.handoffs != driver.DefaultHandoffLimits {
		t.Errorf("default handoff limits: %+v, %v; want %+v", cfg.peer.handoffs, err, driver.DefaultHandoffLimits)
	}
	cfg, err = parse(append(full, "--peer-max-handoffs-per-peer=2", "--peer-max-handoff-bytes-per-peer=10Gi", "--peer-handoff-reap-after=1h")...)
	if want := (driver.HandoffLimits{PerPeer: 2, BytesPerPeer: 10 << 30, ReapAfter: time.Hour}); err != nil || cfg.peer.handoffs != want {
		t.Errorf("handoff limits: %+v, %v; want %+v", cfg.peer.handoffs, err, want)
	}
	for _, bad := range []string{"--peer-min-rate=0", "--peer-min-rate=fast", "--peer-max-streams=0", "--peer-max-streams-per-peer=-1",
		"--peer-max-handoffs-per-peer=0", "--peer-max-handoff-bytes-per-peer=0", "--peer-max-handoff-bytes-per-peer=lots", "--peer-handoff-reap-after=0s"} {
		if _, err := parse(append(full, bad)...); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	l, err := selectorLabels("app=a,component=node")
	if want := map[string]string{"app": "a", "component": "node"}; err != nil || !maps.Equal(l, want) {
		t.Errorf("selectorLabels = %v, %v; want %v", l, err, want)
	}
}

// TestPeerChannelNotUpYet: until the plugin has its CA, a forwarded call
// is Unavailable, which the external-resizer retries.
func TestPeerChannelNotUpYet(t *testing.T) {
	var ch peerChannel
	_, err := ch.ModifyVolume(context.Background(), "n1", &csi.ControllerModifyVolumeRequest{VolumeId: "v-n1"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ModifyVolume before the channel is up: %v", err)
	}
	_, err = ch.ExpandVolume(context.Background(), "n1", &csi.ControllerExpandVolumeRequest{VolumeId: "v-n1"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ExpandVolume before the channel is up: %v", err)
	}
}
