package driver

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TestCapacityPerClass checks GetCapacity answers for the StorageClass whose
// parameters it is given: a class this node refuses at CreateVolume (rate
// limits on the loop backend, bad tuning) gets no capacity, so the scheduler
// never places its volumes here; a plain class gets the node's capacity.
func TestCapacityPerClass(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		params map[string]string
		some   bool
	}{
		{"no parameters", nil, true},
		{"plain class with claim metadata", map[string]string{ParamFsType: "xfs", blockdev.ParamPVCName: "x"}, true},
		{"iops limit on loop", map[string]string{ParamMaxIOPS: "1000"}, false},
		{"bandwidth limit on loop", map[string]string{ParamMaxBandwidth: "100Mi"}, false},
		{"limit of zero", map[string]string{ParamMaxIOPS: "0"}, true},
		{"unknown parameter", map[string]string{"colour": "blue"}, false},
		{"bad queue depth", map[string]string{ParamQueueDepth: "3"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := n.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: tc.params,
				AccessibleTopology: n.d.topology()})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetAvailableCapacity() > 0; got != tc.some {
				t.Errorf("capacity %d for %v: want some=%v", resp.GetAvailableCapacity(), tc.params, tc.some)
			}
			_, err = n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pc-" + filepath.Base(t.Name()),
				CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, Parameters: tc.params})
			if (err == nil) != tc.some {
				t.Errorf("CreateVolume error %v, but GetCapacity said some=%v: they must agree", err, tc.some)
			}
		})
	}
}

// TestClaimMetadataKept checks the PVC name and namespace the provisioner
// passes with --extra-create-metadata are accepted, kept in the volume's
// record across a restart, and reported in the node's status.
func TestClaimMetadataKept(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	n := newTestNode(t, dir)
	ctx := context.Background()
	params := map[string]string{blockdev.ParamPVCName: "data", blockdev.ParamPVCNamespace: "shop",
		blockdev.ParamPVName: "pvc-123"}
	resp, err := n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-123",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, Parameters: params})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	n.d.store.def.Close()
	store, err := store.Open(store.Config{Dir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	storeID, _ := splitID(id)
	v, err := store.Volume(storeID)
	if err != nil {
		t.Fatal(err)
	}
	if ns, name := v.Claim(); ns != "shop" || name != "data" {
		t.Errorf("reopened record: claim %s/%s, want shop/data", ns, name)
	}
	n.d.store = &classes{def: store}
	st, err := n.d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 1 || st.Volumes[0].PVCNamespace != "shop" || st.Volumes[0].PVCName != "data" {
		t.Errorf("status volumes %+v: want one with claim shop/data", st.Volumes)
	}
}

// TestParseReserve pins the --reserve format: a size or a percentage.
func TestParseReserve(t *testing.T) {
	for in, want := range map[string]struct {
		bytes int64
		ratio float64
	}{
		"0": {0, 0}, "1048576": {1 << 20, 0}, "20Gi": {20 << 30, 0}, "5G": {5e9, 0},
		"10%": {0, 0.10}, "0.5%": {0, 0.005}, "0%": {0, 0},
	} {
		b, r, err := ParseReserve(in)
		if err != nil || b != want.bytes || r != want.ratio {
			t.Errorf("ParseReserve(%q) = %d, %v, %v; want %d, %v", in, b, r, err, want.bytes, want.ratio)
		}
	}
	for _, in := range []string{"", "-1", "10GB", "100%", "-5%", "x%", "1.5Gi"} {
		if b, r, err := ParseReserve(in); err == nil {
			t.Errorf("ParseReserve(%q) = %d, %v; want an error", in, b, r)
		}
	}
}
