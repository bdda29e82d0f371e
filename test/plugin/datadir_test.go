package plugin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestDedicatedDisk follows the chart README's recipe for a dedicated data
// disk: an xfs filesystem with reflink (here on a loop device) mounted at
// the data directory, and the plugin started with --reserve. It checks the
// capacity the plugin reports leaves the reserve out, a volume that would
// cut into the reserve is refused with ResourceExhausted, and a snapshot of
// a written volume is a reflink that takes no space of its own.
func TestDedicatedDisk(t *testing.T) {
	testgate.RequireRoot(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	reflinkFS(t, data, 1<<30)
	const reserve = 256 << 20
	p := launchArgs(t, buildBinary(t), dir, []string{"--reserve=256Mi"})
	ctx := context.Background()
	ctrl := csi.NewControllerClient(p.conn)
	free := func() int64 { return freeBytes(t, data) }
	capacity := func() int64 {
		resp, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity()
	}
	const slack = 1 << 20 // metadata files
	if got, want := capacity(), free()-reserve; got > want || got < want-slack {
		t.Fatalf("capacity %d, want the free space %d less the reserve: %d", got, free(), want)
	}
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	_, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "too-big",
		CapacityRange: &csi.CapacityRange{RequiredBytes: capacity() + slack}, VolumeCapabilities: []*csi.VolumeCapability{c}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreateVolume into the reserve: %v, want ResourceExhausted", err)
	}
	id, staging, target := p.provision(t, "vol", 256<<20, c, "dev")
	if err := os.WriteFile(target, make([]byte, 64<<20), 0); err != nil {
		t.Fatal(err)
	}
	before := free()
	snap, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	if used := before - free(); used > 4<<20 {
		t.Errorf("a snapshot of 64 MiB of data on xfs with reflink took %d bytes; want a reflink (next to nothing)", used)
	}
	if _, err := ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	p.release(t, id, staging, target)
}

// TestOnePluginPerEndpoint starts a second plugin on the socket a running
// one serves (two node groups matching one node would do this) with a data
// directory of its own: it must stop at once and say why, and the first
// must keep serving.
func TestOnePluginPerEndpoint(t *testing.T) {
	testgate.RequireRoot(t)
	bin, dir := buildBinary(t), t.TempDir()
	p := launch(t, bin, dir)
	other := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--endpoint", "unix://"+filepath.Join(dir, "csi.sock"), "--backend", "loop",
		"--data-dir", filepath.Join(other, "data"), "--dev-dir", filepath.Join(other, "dev"), "--node-id", "plugin-test",
		"--metrics-address", "").CombinedOutput()
	if ctx.Err() != nil {
		t.Fatal("the second plugin kept running")
	}
	if err == nil || !strings.Contains(string(out), "is served by another csi-fastblk") {
		t.Fatalf("second plugin: %v, output:\n%s\nwant a refusal naming the other plugin", err, out)
	}
	if _, err := csi.NewIdentityClient(p.conn).Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("the first plugin stopped serving: %v", err)
	}
}
