package driver

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TestPreallocationParameter pins the parameter's values: exactly off,
// falloc or full; anything else is refused with a message that names it.
func TestPreallocationParameter(t *testing.T) {
	for in, want := range map[string]blockdev.Preallocation{"off": blockdev.PreallocOff,
		"falloc": blockdev.PreallocFalloc, "full": blockdev.PreallocFull} {
		got, err := preallocationFromParams(map[string]string{ParamPreallocation: in})
		if err != nil || got != want {
			t.Errorf("%s=%q: %q, %v; want %q", ParamPreallocation, in, got, err, want)
		}
	}
	if got, err := preallocationFromParams(nil); err != nil || got != blockdev.PreallocOff {
		t.Errorf("no %s: %q, %v; want off", ParamPreallocation, got, err)
	}
	for _, in := range []string{"", "true", "yes", "Full", "1", "on", "metadata"} {
		err := checkParams(map[string]string{ParamPreallocation: in})
		if err == nil || !strings.Contains(err.Error(), ParamPreallocation) {
			t.Errorf("checkParams(%s=%q) = %v, want an error naming the parameter", ParamPreallocation, in, err)
		}
	}
}

// TestPreallocatedVolume runs a preallocated volume through the driver on
// the loop backend: an invalid value is InvalidArgument, the create
// allocates the file, a retry with the same parameters returns the volume
// and one with other parameters is AlreadyExists, staging with ext4 (whose
// mkfs discards the device by default, which punches the backing file)
// keeps it allocated, a discard of its device is refused, and both expansions (the controller's, and the
// node's of a staged volume) allocate the new range. GetCapacity
// for a preallocating class is never over-provisioned.
func TestPreallocatedVolume(t *testing.T) {
	requireRoot(t)
	testgate.RequireTool(t, "mkfs.ext4")
	testgate.RequireTool(t, "blkdiscard")
	ctx := context.Background()
	dir := t.TempDir()
	n := newTestNode(t, dir)
	pre := map[string]string{ParamPreallocation: "full"}
	req := func(name string, params map[string]string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)}, Parameters: params}
	}
	_, err := n.ctrl.CreateVolume(ctx, req("bad", map[string]string{ParamPreallocation: "yes"}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), ParamPreallocation) {
		t.Fatalf("CreateVolume with %s=yes = %v, want InvalidArgument naming it", ParamPreallocation, err)
	}
	resp, err := n.ctrl.CreateVolume(ctx, req("pre", pre))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	file := n.d.store.VolumeFile(storeVolumeID(id))
	allocated := func(when string, size int64) {
		t.Helper()
		if got := testfs.Allocated(t, file); got < size {
			t.Fatalf("%s: %d bytes of the backing file allocated, want %d", when, got, size)
		}
	}
	allocated("created", 16<<20)
	if again, err := n.ctrl.CreateVolume(ctx, req("pre", pre)); err != nil || again.GetVolume().GetVolumeId() != id {
		t.Fatalf("repeated CreateVolume = %v, %v; want %s", again, err, id)
	}
	if _, err := n.ctrl.CreateVolume(ctx, req("pre", nil)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateVolume of the name without preallocation = %v, want AlreadyExists", err)
	}

	target := n.stage(id, mountCap("ext4", snw), false)
	allocated("staged with ext4", 16<<20)
	// mkfs zeroed its inode tables (in place), so the kernel's lazy init
	// will not: that zeroing reaches the device as a WRITE_ZEROES that
	// may unmap, which the loop device turns into a hole in the file.
	out, err := exec.Command("sh", "-c", "dumpe2fs \"$(findmnt -n -o SOURCE --target "+target+")\"").CombinedOutput()
	if err != nil {
		t.Fatalf("dumpe2fs: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Group ") && strings.Contains(line, "(Blocks") && !strings.Contains(line, "ITABLE_ZEROED") {
			t.Errorf("preallocated volume's ext4 left its inode table to the lazy init: %s", line)
		}
	}
	n.unstage(id)
	if _, err := n.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 24 << 20}}); err != nil {
		t.Fatal(err)
	}
	allocated("expanded by the controller", 24<<20)
	// Raw block: growing ext4 online needs CAP_SYS_RESOURCE, which a
	// test sandbox may withhold; the file grows the same way.
	target = n.stage(id, blockCap(snw), false)
	// Its device takes no discard, which would punch the backing file.
	if out, err := exec.Command("blkdiscard", "-f", target).CombinedOutput(); err == nil {
		t.Errorf("blkdiscard of a preallocated volume's device succeeded: %s", out)
	}
	allocated("after a discard", 24<<20)
	if _, err := n.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}}); err != nil {
		t.Fatal(err)
	}
	allocated("expanded on the node", 32<<20)

	// Over-provisioned 4×: a preallocating class gets only the free space.
	o, err := store.Open(store.Config{Dir: filepath.Join(dir, "data"), OverProvisionRatio: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	n.d.store = &classes{def: o}
	capFor := func(params map[string]string) int64 {
		resp, err := n.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: params, AccessibleTopology: n.d.topology()})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity()
	}
	thin, thick := capFor(nil), capFor(pre)
	want, err := o.PreallocatedCapacity()
	if err != nil {
		t.Fatal(err)
	}
	if thick == 0 || thick > thin/2 || thick > want+slackBytes || thick < want-slackBytes {
		t.Fatalf("GetCapacity: %d for a sparse class, %d for a preallocating one; want about %d, a quarter", thin, thick, want)
	}
	if got := capFor(map[string]string{ParamPreallocation: "maybe"}); got != 0 {
		t.Fatalf("GetCapacity for a class with %s=maybe = %d, want none", ParamPreallocation, got)
	}
}

// slackBytes absorbs what other writers of the test's filesystem move
// between two reads of its free space.
const slackBytes = 1 << 20
