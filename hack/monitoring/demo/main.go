// Command demo gives a running csi-fastblk plugin volumes with I/O, for
// hack/monitoring/screenshot.sh: over the plugin's CSI socket it creates
// volumes with the PVC metadata the external-provisioner would pass,
// stages and publishes them as raw block devices, runs a different I/O
// pattern on each until -duration is over, and then unpublishes, unstages
// and deletes them. It needs root (the plugin attaches loop devices).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// volume is one demo volume and the I/O it does.
type volume struct {
	namespace, claim string
	size             int64
	pattern          func(ctx context.Context, fd int, size int64, buf []byte) error
}

var volumes = []volume{
	{"shop", "orders-db", 128 << 20, randomRW(4096, 3)},
	{"shop", "cache", 64 << 20, randomRW(4096, 0)},
	{"analytics", "warehouse", 256 << 20, sequentialWrite(1 << 20)},
	{"logs", "ingest", 64 << 20, syncedAppend(16 << 10)},
}

func main() {
	endpoint := flag.String("endpoint", "unix:///tmp/csi-fastblk-demo/csi.sock", "the plugin's CSI endpoint")
	dir := flag.String("dir", "/tmp/csi-fastblk-demo", "directory for staging and target paths")
	duration := flag.Duration("duration", 3*time.Minute, "how long the volumes do I/O")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *endpoint, *dir, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, endpoint, dir string, duration time.Duration) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	ioCtx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(volumes))
	for i, v := range volumes {
		pv := fmt.Sprintf("pvc-demo-%d", i)
		vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: pv, VolumeCapabilities: []*csi.VolumeCapability{c},
			CapacityRange: &csi.CapacityRange{RequiredBytes: v.size},
			Parameters: map[string]string{"csi.storage.k8s.io/pvc/namespace": v.namespace,
				"csi.storage.k8s.io/pvc/name": v.claim, "csi.storage.k8s.io/pv/name": pv}})
		if err != nil {
			return fmt.Errorf("create %s: %w", pv, err)
		}
		id := vol.GetVolume().GetVolumeId()
		staging, target := filepath.Join(dir, "staging", pv), filepath.Join(dir, "pods", pv)
		if err := os.MkdirAll(staging, 0o750); err != nil {
			return err
		}
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
			return fmt.Errorf("stage %s: %w", pv, err)
		}
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: c}); err != nil {
			return fmt.Errorf("publish %s: %w", pv, err)
		}
		defer func() {
			bg := context.Background()
			node.NodeUnpublishVolume(bg, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			node.NodeUnstageVolume(bg, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			if _, err := ctrl.DeleteVolume(bg, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				fmt.Fprintf(os.Stderr, "demo: delete %s: %v\n", id, err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := drive(ioCtx, target, v); err != nil {
				errs <- fmt.Errorf("%s/%s: %w", v.namespace, v.claim, err)
			}
		}()
		fmt.Printf("volume %s (%s/%s) at %s\n", id, v.namespace, v.claim, target)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// drive runs the volume's pattern on its device until ctx ends.
func drive(ctx context.Context, path string, v volume) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	for ctx.Err() == nil {
		if err := v.pattern(ctx, fd, v.size, buf); err != nil {
			return err
		}
	}
	return nil
}

// randomRW does bs-sized random I/O, writesPer4 writes in every 4.
func randomRW(bs int, writesPer4 int) func(context.Context, int, int64, []byte) error {
	return func(_ context.Context, fd int, size int64, buf []byte) error {
		for i := range 4 {
			off := rand.Int64N(size/int64(bs)) * int64(bs)
			var err error
			if i < writesPer4 {
				_, err = unix.Pwrite(fd, buf[:bs], off)
			} else {
				_, err = unix.Pread(fd, buf[:bs], off)
			}
			if err != nil {
				return err
			}
		}
		time.Sleep(time.Millisecond)
		return nil
	}
}

// sequentialWrite writes the device from start to end in bs requests, at
// about 20 MB/s, and starts over.
func sequentialWrite(bs int) func(context.Context, int, int64, []byte) error {
	return func(ctx context.Context, fd int, size int64, buf []byte) error {
		for off := int64(0); off < size && ctx.Err() == nil; off += int64(bs) {
			if _, err := unix.Pwrite(fd, buf[:bs], off); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
}

// syncedAppend writes bs at a time, each followed by fdatasync, as a log.
func syncedAppend(bs int) func(context.Context, int, int64, []byte) error {
	var off int64
	return func(_ context.Context, fd int, size int64, buf []byte) error {
		if _, err := unix.Pwrite(fd, buf[:bs], off); err != nil {
			return err
		}
		off = (off + int64(bs)) % size
		time.Sleep(5 * time.Millisecond)
		return unix.Fdatasync(fd)
	}
}
