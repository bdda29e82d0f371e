//go:build failpoint

package driver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// TestMountedSnapshotHoldsDeviceIO is issue 51's defect 4: a mounted ublk
// volume is frozen for its snapshot, but a freeze stops the filesystem's
// writers, not a writer that has the device open (root, beside the
// filesystem: a dd, a backup agent). Its write, recorded in the device's
// change record and still in flight when the snapshot cuts the record,
// reaches the file after the copy: the snapshot lacks it, the next one has
// it, and the record between them does not name it. The snapshot must
// hold the device's I/O too, and wait for what is in flight, before the
// cut. Here the server thread holds each such write (a test hook) while
// the snapshot is taken; each delta must still cover every block in which
// the snapshots differ. The filesystem is mounted read-only, so that its
// freeze writes nothing through the server thread the hook holds.
func TestMountedSnapshotHoldsDeviceIO(t *testing.T) {
	testgate.RequireUblk(t)
	dir := t.TempDir()
	n := serveMetadata(t, newTestNodeWith(t, dir, "n1", "ublk"))
	vol := n.create("pvc-mounted", 512*mib, nil)
	// Staged once read-write (made ext4), then read-only.
	ctx := context.Background()
	staging := filepath.Join(dir, "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	c := mountCap("ext4", snw)
	for _, flags := range [][]string{nil, {"ro"}} {
		c.GetMount().MountFlags = flags
		if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
			t.Fatalf("stage with %q: %v", flags, err)
		}
		if flags == nil {
			if _, err := n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer func() {
		if _, err := n.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
			t.Errorf("unstage: %v", err)
		}
	}()
	v, err := n.d.store.Volume(storeVolumeID(vol))
	if err != nil {
		t.Fatal(err)
	}
	// The writer's range, [264 MiB, 376 MiB), lies in a block group of the
	// filesystem with neither metadata nor a superblock backup: its
	// writes change no file and no structure of the filesystem.
	const lo, hi = 264 * mib, 376 * mib
	issued := make(chan struct{}, 1)
	stop := ublk.OnWriteIssued(func(off uint64, n uint32) {
		if off >= lo && off < hi {
			select {
			case issued <- struct{}{}:
			default:
			}
			time.Sleep(time.Second)
		}
	})
	defer stop()
	pod := openPod(t, v.Node.Device)
	rng := rand.New(rand.NewPCG(4, 4))
	prev := n.snapshot("mounted-0", vol)
	for round := 1; round <= 3; round++ {
		done := make(chan struct{})
		off := lo + rng.Int64N((hi-lo)/(64<<10))*(64<<10)
		go func() {
			defer close(done)
			pod.write(off, 64<<10, byte(round))
		}()
		<-issued // recorded and in flight: the snapshot now
		s := n.snapshot(fmt.Sprintf("mounted-%d", round), vol)
		<-done
		checkNoMiss(t, n, prev, s, fmt.Sprintf("round %d (the write at %d in flight at the snapshot)", round, off))
		prev = s
	}
	// The last write landed after the last cut: the next delta must
	// name it.
	checkNoMiss(t, n, prev, n.snapshot("mounted-last", vol), "after the last round")
	pod.close()
}
