package driver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// tagRecorder is a Forwarder that records the node tag each call went to.
type tagRecorder struct{ tags []string }

func (r *tagRecorder) ModifyVolume(_ context.Context, tag string, _ *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	r.tags = append(r.tags, tag)
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func (r *tagRecorder) ExpandVolume(_ context.Context, tag string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	r.tags = append(r.tags, tag)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
}

func (r *tagRecorder) CreateVolume(context.Context, string, *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return nil, status.Error(codes.Internal, "the relay never hands off")
}

func (r *tagRecorder) ReadData(context.Context, string, *peer.ReadRequest, peer.Sink, time.Duration) (peer.Received, error) {
	return peer.Received{}, status.Error(codes.Internal, "the relay never pulls")
}

// TestRelayForwardsToTheVolumesNode: the controller's CSI service sends a
// class change or an expansion to the node its volume ID names, after the
// plugin's own checks of the request; an ID without a node, a bad
// parameter, expansion not advertised or no channel are refused before
// anything is sent.
func TestRelayForwardsToTheVolumesNode(t *testing.T) {
	ctx := context.Background()
	id := "v" + strings.Repeat("a", 32) + "-n2"
	rec := &tagRecorder{}
	ctl := relayController{r: NewRelay("fastblk.csi.io", "test", true, rec)}
	if _, err := ctl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{ParamMaxIOPS: "100"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
	if err != nil || resp.GetCapacityBytes() != 1<<30 {
		t.Fatalf("expand: %v %v", resp, err)
	}
	if strings.Join(rec.tags, ",") != "n2,n2" {
		t.Fatalf("calls went to %v, want n2 twice", rec.tags)
	}
	for _, tc := range []struct {
		name string
		ctl  relayController
		call func(relayController) error
		want codes.Code
		says string
	}{
		{"no node in the ID", ctl, func(c relayController) error {
			_, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: "v" + strings.Repeat("a", 32)})
			return err
		}, codes.FailedPrecondition, "names no node"},
		{"unknown parameter", ctl, func(c relayController) error {
			_, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"color": "red"}})
			return err
		}, codes.InvalidArgument, "color"},
		{"no capacity", ctl, func(c relayController) error {
			_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id})
			return err
		}, codes.InvalidArgument, "capacity range is missing"},
		{"expansion not advertised", relayController{r: NewRelay("fastblk.csi.io", "test", false, rec)}, func(c relayController) error {
			_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
			return err
		}, codes.Unimplemented, "--controller-expansion"},
		{"no peer channel", relayController{r: NewRelay("fastblk.csi.io", "test", true, nil)}, func(c relayController) error {
			_, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id})
			return err
		}, codes.FailedPrecondition, "peer channel is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(rec.tags)
			err := tc.call(tc.ctl)
			if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%v; want %v saying %q", err, tc.want, tc.says)
			}
			if len(rec.tags) != before {
				t.Error("a refused call was sent")
			}
		})
	}
	caps, _ := ctl.ControllerGetCapabilities(ctx, nil)
	if len(caps.GetCapabilities()) != 2 {
		t.Errorf("capabilities %v, want MODIFY_VOLUME and EXPAND_VOLUME", caps)
	}
}
