package driver

import (
	"context"
	"errors"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Identity implements csi.IdentityServer.
type Identity struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

func (s *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.d.cfg.Name, VendorVersion: s.d.cfg.Version}, nil
}

func (s *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		svc(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		svc(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE),
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		svc(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE),
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
			Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe reports ready only when the plugin is healthy (Healthy); while a
// readiness check fails (the kubelet has not confirmed the registration
// yet) it answers "not ready", which sidecars wait out, instead of an
// error, which they treat as fatal.
func (s *Identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := s.d.Healthy(ctx); err != nil {
		if h, ok := errors.AsType[*healthError](err); ok && h.notReady {
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// Healthy checks what the plugin needs to serve: free capacity can be read
// from the data directory, the backend can list its devices, and none of
// them holds its I/O for a failure the backend did not heal
// (blockdev.HealthReporter). The other device classes' directories do not
// count: a restart would not mend one, and the plugin serves the others
// (status and storage health tell).
func (d *Driver) Healthy(ctx context.Context) error {
	if _, _, err := d.store.def.Capacity(); err != nil {
		return &healthError{part: "data directory", err: err}
	}
	if _, err := d.backend.List(ctx); err != nil {
		return &healthError{part: d.backend.Name() + " backend", err: err}
	}
	if h, ok := d.backend.(blockdev.HealthReporter); ok {
		if err := h.Health(); err != nil {
			return &healthError{part: d.backend.Name() + " devices", err: err}
		}
	}
	return d.ready(ctx)
}

// healthError is a failed health check: the part of the plugin that failed
// and why.
type healthError struct {
	part string
	err  error
	// notReady: a readiness check failed (readiness.go); its error names
	// no path and is told whole.
	notReady bool
}

func (e *healthError) Error() string { return e.part + ": " + e.err.Error() }
func (e *healthError) Unwrap() error { return e.err }

// HealthSummary is err, a failed health check, told without host paths,
// for answers on the network (/healthz): the part that failed and the
// system error's text, or only the part.
func HealthSummary(err error) string {
	if err == nil {
		return ""
	}
	part := "health check"
	if h, ok := errors.AsType[*healthError](err); ok {
		if h.notReady {
			return h.Error()
		}
		part = h.part
	}
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return part + ": " + errno.Error()
	}
	return part + " failed"
}
