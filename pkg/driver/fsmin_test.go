package driver

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFitFilesystem: a mount volume below its filesystem's smallest size is
// rounded up within limit_bytes, or refused with OutOfRange. Before, a
// 1 MiB xfs claim was created at 1 MiB and every NodeStageVolume failed in
// mkfs.xfs ("Filesystem must be larger than 300MB").
func TestFitFilesystem(t *testing.T) {
	const xfsMin = 300 << 20
	xfs, ext4 := mountCap("xfs", snw), mountCap("ext4", snw)
	for _, tc := range []struct {
		name     string
		req, lim int64
		caps     []*csi.VolumeCapability
		params   map[string]string
		want     int64
		code     codes.Code
	}{
		{"xfs 1 MiB rounded up", 1 << 20, 0, []*csi.VolumeCapability{xfs}, nil, xfsMin, codes.OK},
		{"xfs by parameter", 1 << 20, 0, []*csi.VolumeCapability{mountCap("", snw)}, map[string]string{ParamFsType: "xfs"}, xfsMin, codes.OK},
		{"xfs rounded up to the limit", 1 << 20, xfsMin, []*csi.VolumeCapability{xfs}, nil, xfsMin, codes.OK},
		{"xfs limit below its minimum", 1 << 20, 2 << 20, []*csi.VolumeCapability{xfs}, nil, 0, codes.OutOfRange},
		{"xfs above its minimum", 1 << 30, 0, []*csi.VolumeCapability{xfs}, nil, 1 << 30, codes.OK},
		{"ext4 1 MiB kept", 1 << 20, 0, []*csi.VolumeCapability{ext4}, nil, 1 << 20, codes.OK},
		{"ext4 4 KiB rounded up", 4096, 0, []*csi.VolumeCapability{ext4}, nil, 128 << 10, codes.OK},
		{"block 1 MiB kept", 1 << 20, 0, []*csi.VolumeCapability{blockCap(snw)}, nil, 1 << 20, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, t.TempDir())
			resp, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "v", Parameters: tc.params,
				CapacityRange: &csi.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.lim}, VolumeCapabilities: tc.caps})
			if status.Code(err) != tc.code {
				t.Fatalf("CreateVolume = %v, want code %v", err, tc.code)
			}
			if got := resp.GetVolume().GetCapacityBytes(); got != tc.want {
				t.Errorf("capacity %d, want %d", got, tc.want)
			}
		})
	}
}

// TestSmallXFSClaimStages creates a 1 MiB xfs volume, as Kubernetes' storage
// suite claims one, and stages it with the real mkfs.xfs: before, mkfs
// refused the device and the volume could never be used.
func TestSmallXFSClaimStages(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	c := mountCap("xfs", snw)
	resp, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "small-xfs",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, VolumeCapabilities: []*csi.VolumeCapability{c}})
	if err != nil {
		t.Fatal(err)
	}
	n.stage(resp.GetVolume().GetVolumeId(), c, false)
}
