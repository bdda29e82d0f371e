package driver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// TestReadOnlyPublishIgnoresRWFlag publishes a mounted volume read-only
// with "rw" among the capability's mount flags: read-only must win, and
// the kernel must refuse writes with EROFS.
func TestReadOnlyPublishIgnoresRWFlag(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	id := n.create("ro-rw", 64<<20, nil)
	c := mountCap("ext4", snw)
	c.GetMount().MountFlags = []string{"rw", "noatime"}
	target := n.stage(id, c, true)
	err := os.WriteFile(filepath.Join(target, "x"), []byte("x"), 0o600)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write into a read-only publication with mount flag rw = %v, want EROFS", err)
	}
}

// TestCapacityNearMaxInt64 proves sizes that cannot be rounded up to the
// 4 KiB unit without overflowing are OutOfRange, not a wrapped size.
func TestCapacityNearMaxInt64(t *testing.T) {
	for _, req := range []int64{math.MaxInt64, math.MaxInt64/4096*4096 + 1} {
		size, err := sizeFor(&csi.CapacityRange{RequiredBytes: req})
		if status.Code(err) != codes.OutOfRange {
			t.Errorf("sizeFor(required %d) = %d, %v; want OutOfRange", req, size, err)
		}
	}
	if size, err := sizeFor(&csi.CapacityRange{RequiredBytes: math.MaxInt64 / 4096 * 4096}); err != nil || size != math.MaxInt64/4096*4096 {
		t.Errorf("sizeFor(largest aligned size) = %d, %v", size, err)
	}
	n := newTestNode(t, t.TempDir())
	_, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "huge",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: math.MaxInt64 - 1},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}})
	if status.Code(err) != codes.OutOfRange {
		t.Errorf("CreateVolume of %d bytes = %v, want OutOfRange", int64(math.MaxInt64-1), err)
	}
}

// TestCreateVolumeChecksQueuesAgainstCPUs proves a StorageClass asking for
// more ublk queues than the node has CPUs is refused at creation, naming
// the parameter, instead of failing later at stage.
func TestCreateVolumeChecksQueuesAgainstCPUs(t *testing.T) {
	n := newTestNode(t, t.TempDir())
	create := func(name, queues string) error {
		_, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)},
			Parameters:         map[string]string{ParamQueues: queues}})
		return err
	}
	cpus := runtime.NumCPU()
	err := create("too-many", strconv.Itoa(cpus+1))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), ParamQueues) {
		t.Errorf("queues=%d on %d CPUs = %v, want InvalidArgument naming %q", cpus+1, cpus, err, ParamQueues)
	}
	if err := create("as-many", strconv.Itoa(cpus)); err != nil {
		t.Errorf("queues=%d on %d CPUs = %v, want success", cpus, cpus, err)
	}
}

// TestStageErrorNamesTuningParameter proves that when the backend refuses
// a device's tuning at stage (the ublk server's error, which knows nothing
// of StorageClasses), the error names the parameters the volume asked for
// and stays InvalidArgument.
func TestStageErrorNamesTuningParameter(t *testing.T) {
	refused := fmt.Errorf("attach v1: tuning: queues 8 not in 1..2: %w", blockdev.ErrInvalid)
	err := tuningError(map[string]string{ParamQueues: "8", ParamFsType: "xfs"}, refused)
	if !strings.Contains(err.Error(), "queues=8") || codeOf(err) != codes.InvalidArgument {
		t.Errorf("stage error %q (code %v): want it to name queues=8 and be InvalidArgument", err, codeOf(err))
	}
	other := fmt.Errorf("attach v1: %w", blockdev.ErrNoSpace)
	if got := tuningError(map[string]string{ParamQueues: "8"}, other); got != other {
		t.Errorf("an error that is not about tuning became %q", got)
	}
}
