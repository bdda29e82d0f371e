package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/mountinfo"
)

// stage attaches v's device and, for mount access, formats it if it is empty
// and mounts it at staging. The node state is persisted before the mount so
// that a crash in between leaves a record NodeUnstage can undo.
func (d *Driver) stage(ctx context.Context, v blockdev.Volume, staging string, c *csi.VolumeCapability) error {
	block := c.GetBlock() != nil
	if cur := v.Node.StagingPath; cur != "" {
		if cur != staging {
			return fmt.Errorf("already staged at %s: %w", cur, blockdev.ErrBusy)
		}
		if v.Node.Block != block {
			return fmt.Errorf("already staged at %s with another access type: %w", cur, blockdev.ErrConflict)
		}
		if block {
			return nil
		}
		if mounted, err := d.mounter.IsMountPoint(staging); err == nil && mounted {
			return nil
		}
	}
	if !block && d.backend.Name() == "ublk" {
		if err := refuseLastMountHolder(staging); err != nil {
			return err
		}
	}
	dev, err := d.attach(ctx, v)
	if err != nil {
		return fmt.Errorf("attach: %w", tuningError(v.Params, err))
	}
	keepAllocated(v, dev)
	ns := blockdev.NodeState{
		StagingPath: staging,
		Block:       block,
		Device:      devicePath(dev),
		Backend:     dev.Backend,
		Tuning:      dev.Tuning,
	}
	if !block {
		ns.FsType = fsTypeFor(c, v.Params)
	}
	if _, err := d.store.UpdateNode(ctx, v.ID, ns); err != nil {
		return errors.Join(fmt.Errorf("record staging: %w", err), d.detach(ctx, v.ID))
	}
	klog.InfoS("volume attached", "volumeID", v.ID, "device", dev.Path, "link", dev.Link,
		"backend", dev.Backend, "queues", dev.Tuning.Queues, "queueDepth", dev.Tuning.QueueDepth,
		"maxIOBytes", dev.Tuning.MaxIOBytes, "limits", dev.Limits)
	if block {
		return nil
	}
	opts := c.GetMount().GetMountFlags()
	if strings.HasPrefix(ns.FsType, "ext") && !isReadOnlyMode(c) && !slices.Contains(opts, "ro") {
		if err := d.growExtUnmounted(ctx, v.ID, ns.Device); err != nil {
			return errors.Join(err, d.undoStage(ctx, v.ID))
		}
	}
	if ns.FsType == "xfs" {
		// A restored snapshot or a clone carries its source's XFS UUID;
		// without nouuid the kernel refuses to mount both on one node.
		opts = append(opts, "nouuid")
	}
	if err := d.mounter.FormatAndMountSensitiveWithFormatOptions(ns.Device, staging, ns.FsType, opts, nil, formatOptions(v, ns.FsType)); err != nil {
		err = fmt.Errorf("format and mount %s (%s) at %s: %w", ns.Device, ns.FsType, staging, err)
		return errors.Join(err, d.undoStage(ctx, v.ID))
	}
	// A volume restored or cloned into a larger size has its source's
	// filesystem on a larger device: grow it to the device, as the claim
	// asked (a failure leaves the volume unstaged, not smaller than asked).
	// xfs grows only mounted; an ext filesystem has already grown above.
	if v.SourceSnapshotID == "" && v.SourceVolumeID == "" {
		klog.InfoS("volume staged", "volumeID", v.ID, "stagingPath", staging, "fsType", ns.FsType)
		return nil
	}
	if err := d.growToDevice(ns); err != nil {
		return errors.Join(err, d.unmountIfMounted(staging), d.undoStage(ctx, v.ID))
	}
	klog.InfoS("volume staged", "volumeID", v.ID, "stagingPath", staging, "fsType", ns.FsType)
	return nil
}

// growExtUnmounted grows the ext filesystem on dev to the device before it
// is mounted. The device is larger than its filesystem when the volume was
// restored or cloned into a larger size, or grown by ControllerExpandVolume
// while it was not staged (the kubelet then stages it and asks
// NodeExpandVolume to grow the filesystem). Offline growth needs no
// CAP_SYS_RESOURCE, which growing a mounted ext4 does and which containers
// may lack, and resize2fs on the mounted filesystem then has nothing to do.
// An unformatted device or another filesystem is left to the mount.
func (d *Driver) growExtUnmounted(ctx context.Context, id, dev string) error {
	fs, err := fsstat.ReadExtSize(dev)
	if errors.Is(err, blockdev.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	size, err := blkdev.Size(dev)
	if err != nil {
		return err
	}
	if size-fs.Bytes() < fs.BlockSize {
		return nil
	}
	// resize2fs refuses a filesystem mounted since its last full check, or
	// with a journal to replay (a snapshot of a mounted volume has one).
	// e2fsck exits 1 or 2 when it corrected errors, 4 or more when it
	// could not.
	if out, err := d.exec.CommandContext(ctx, "e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() >= 4 {
			return fmt.Errorf("check the ext filesystem on %s before growing it: %w: %s", dev, err, bytes.TrimSpace(out))
		}
	}
	if out, err := d.exec.CommandContext(ctx, "resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("grow the ext filesystem on %s from %d to %d bytes: %w: %s", dev, fs.Bytes(), size, err, bytes.TrimSpace(out))
	}
	klog.InfoS("filesystem grown to its device before mounting", "volumeID", id, "device", dev, "fromBytes", fs.Bytes(), "toBytes", size)
	return nil
}

// refuseLastMountHolder refuses to mount a ublk volume's filesystem at
// staging when the plugin's own mount namespace would hold that mount
// alone: the plugin, serving the device, would then be its last holder, and
// its exit would deadlock on the filesystem's writeback (see
// mountinfo.MountDiesWithProcess). Nothing is attached yet.
func refuseLastMountHolder(staging string) error {
	dies, why, err := mountinfo.MountDiesWithProcess(staging)
	if err != nil {
		return fmt.Errorf("check the staging path's mount propagation: %w", err)
	}
	if dies {
		return fmt.Errorf("refusing to mount a ublk volume where only the plugin's mount namespace would hold it (%s): "+
			"the plugin serves the device, and its exit would hang on the filesystem's writeback; give the plugin the "+
			"kubelet directory with mountPropagation: Bidirectional: %w", why, blockdev.ErrNotSupported)
	}
	return nil
}

// growToDevice grows the filesystem mounted at ns.StagingPath when it is
// smaller than its device.
func (d *Driver) growToDevice(ns blockdev.NodeState) error {
	// resize2fs decides whether to grow online by finding the device in
	// the mount table, which names the kernel node, not our link.
	dev, err := filepath.EvalSymlinks(ns.Device)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", ns.Device, err)
	}
	rs := mount.NewResizeFs(d.exec)
	need, err := rs.NeedResize(dev, ns.StagingPath)
	if err != nil {
		return fmt.Errorf("compare the %s filesystem at %s with its device: %w", ns.FsType, ns.StagingPath, err)
	}
	if !need {
		return nil
	}
	if _, err := rs.Resize(dev, ns.StagingPath); err != nil {
		return fmt.Errorf("grow the %s filesystem at %s to its device: %w", ns.FsType, ns.StagingPath, err)
	}
	klog.InfoS("filesystem grown to its device", "device", dev, "stagingPath", ns.StagingPath, "fsType", ns.FsType)
	return nil
}

func devicePath(dev blockdev.Device) string {
	if dev.Link != "" {
		return dev.Link
	}
	return dev.Path
}

// undoStage detaches and forgets a half-made staging.
func (d *Driver) undoStage(ctx context.Context, id string) error {
	if err := d.detach(ctx, id); err != nil {
		return fmt.Errorf("detach after failed stage: %w", err)
	}
	_, err := d.store.UpdateNode(ctx, id, blockdev.NodeState{})
	return err
}

// unstage unmounts the staging path and detaches the device. Unstaging a
// volume that is not staged succeeds.
func (d *Driver) unstage(ctx context.Context, v blockdev.Volume, staging string) error {
	if v.Node.StagingPath != "" && v.Node.StagingPath != staging {
		return fmt.Errorf("staged at %s, not %s: %w", v.Node.StagingPath, staging, blockdev.ErrBusy)
	}
	if n := len(v.Node.Targets); n > 0 {
		return fmt.Errorf("still published at %d target(s): %w", n, blockdev.ErrBusy)
	}
	if err := d.unmountIfMounted(staging); err != nil {
		return err
	}
	if err := d.detach(ctx, v.ID); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	if v.Node.StagingPath == "" {
		return nil
	}
	if _, err := d.store.UpdateNode(ctx, v.ID, blockdev.NodeState{}); err != nil {
		return fmt.Errorf("record unstaging: %w", err)
	}
	klog.InfoS("volume unstaged", "volumeID", v.ID, "stagingPath", staging)
	return nil
}

func (d *Driver) unmountIfMounted(path string) error {
	mounted, err := d.mounter.IsMountPoint(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check mount %s: %w", path, err)
	}
	if !mounted {
		return nil
	}
	if err := d.mounter.Unmount(path); err != nil {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// publish bind-mounts the staged filesystem (or the device, for block
// access) at target.
func (d *Driver) publish(ctx context.Context, v blockdev.Volume, staging, target string, c *csi.VolumeCapability, pub blockdev.Publish) error {
	ns := v.Node
	if ns.StagingPath != staging {
		return fmt.Errorf("volume is not staged at %s: %w", staging, blockdev.ErrBusy)
	}
	block := c.GetBlock() != nil
	if block != ns.Block {
		return fmt.Errorf("staged for %s access: %w", accessName(ns.Block), blockdev.ErrConflict)
	}
	if cur, ok := ns.Targets[target]; ok {
		if cur != pub {
			return fmt.Errorf("already published at %s with other options: %w", target, blockdev.ErrConflict)
		}
	} else if err := checkSingleWriter(ns.Targets, pub); err != nil {
		return err
	}
	ns.Targets = maps.Clone(ns.Targets)
	if ns.Targets == nil {
		ns.Targets = map[string]blockdev.Publish{}
	}
	ns.Targets[target] = pub
	if _, err := d.store.UpdateNode(ctx, v.ID, ns); err != nil {
		return fmt.Errorf("record publication: %w", err)
	}
	err := d.bindMount(ns, target, c, pub.ReadOnly)
	if err == nil {
		err = syncBlockReadOnly(ns)
	}
	if err != nil {
		delete(ns.Targets, target)
		_, uerr := d.store.UpdateNode(ctx, v.ID, ns)
		return errors.Join(err, uerr, d.cleanupTarget(target))
	}
	klog.InfoS("volume published", "volumeID", v.ID, "target", target, "readOnly", pub.ReadOnly)
	return nil
}

// checkSingleWriter enforces SINGLE_NODE_SINGLE_WRITER: such a volume is
// published at one target only.
func checkSingleWriter(targets map[string]blockdev.Publish, pub blockdev.Publish) error {
	for t, p := range targets {
		if pub.SingleWriter || p.SingleWriter {
			return fmt.Errorf("single-writer volume already published at %s: %w", t, blockdev.ErrBusy)
		}
	}
	return nil
}

// syncBlockReadOnly makes a raw block device read-only while every
// publication of it is read-only, and writable otherwise.
func syncBlockReadOnly(ns blockdev.NodeState) error {
	if !ns.Block {
		return nil
	}
	ro := len(ns.Targets) > 0
	for _, p := range ns.Targets {
		ro = ro && p.ReadOnly
	}
	return blkdev.SetReadOnly(ns.Device, ro)
}

func accessName(block bool) string {
	if block {
		return "block"
	}
	return "mount"
}

func (d *Driver) bindMount(ns blockdev.NodeState, target string, c *csi.VolumeCapability, ro bool) error {
	source := ns.StagingPath
	if ns.Block {
		source = ns.Device
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return fmt.Errorf("create target parent: %w", err)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return fmt.Errorf("create target file: %w", err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create target directory: %w", err)
	}
	if mounted, err := d.mounter.IsMountPoint(target); err != nil {
		return fmt.Errorf("check mount %s: %w", target, err)
	} else if mounted {
		return nil
	}
	if err := d.mounter.Mount(source, target, "", publishOptions(c.GetMount().GetMountFlags(), ro)); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", source, target, err)
	}
	return nil
}

// publishOptions are the bind mount's options: the capability's mount flags,
// and for a read-only publication "ro" last and no "rw", so that read-only
// wins whatever the flags say.
func publishOptions(flags []string, ro bool) []string {
	opts := []string{"bind"}
	for _, f := range flags {
		if ro && f == "rw" {
			continue
		}
		opts = append(opts, f)
	}
	if ro {
		opts = append(opts, "ro")
	}
	return opts
}

// unpublish removes the bind mount and the target path it created.
func (d *Driver) unpublish(ctx context.Context, v blockdev.Volume, target string) error {
	if err := d.cleanupTarget(target); err != nil {
		return err
	}
	if _, ok := v.Node.Targets[target]; !ok {
		return nil
	}
	ns := v.Node
	ns.Targets = maps.Clone(ns.Targets)
	delete(ns.Targets, target)
	if err := syncBlockReadOnly(ns); err != nil {
		return err
	}
	if _, err := d.store.UpdateNode(ctx, v.ID, ns); err != nil {
		return fmt.Errorf("record unpublication: %w", err)
	}
	klog.InfoS("volume unpublished", "volumeID", v.ID, "target", target)
	return nil
}

func (d *Driver) cleanupTarget(target string) error {
	if err := mount.CleanupMountPoint(target, d.mounter, true); err != nil {
		return fmt.Errorf("clean up %s: %w", target, err)
	}
	return nil
}

// volumeUsedAt returns the ID of a volume staged or published at path.
func (d *Driver) volumeUsedAt(path string) (string, bool) {
	for _, v := range d.store.Volumes() {
		if usedAt(v.Node, path) {
			return v.ID, true
		}
	}
	return "", false
}

// usedAt reports whether the volume is staged or published at path.
func usedAt(ns blockdev.NodeState, path string) bool {
	if path == ns.StagingPath {
		return true
	}
	_, ok := ns.Targets[path]
	return ok
}

func (d *Driver) volumeStats(path string) (*csi.NodeGetVolumeStatsResponse, error) {
	isDev, err := blkdev.IsDevice(path)
	if err != nil {
		return nil, toStatus(err)
	}
	if isDev {
		size, err := blkdev.Size(path)
		if err != nil {
			return nil, toStatus(err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: size},
		}}, nil
	}
	st, err := fsstat.Stat(path)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}

// expand grows the device to the volume's size and then, for mount access,
// the filesystem, online.
func (d *Driver) expand(ctx context.Context, v blockdev.Volume, path string, size int64) (int64, error) {
	ns := v.Node
	if ns.StagingPath == "" {
		return 0, fmt.Errorf("volume is not staged on this node: %w", blockdev.ErrNotFound)
	}
	if !usedAt(ns, path) {
		return 0, fmt.Errorf("volume is not staged or published at %s: %w", path, blockdev.ErrNotFound)
	}
	if size > v.SizeBytes {
		// Node-only expansion: the volume lives here, so the node grows
		// its file (idempotent; the store never shrinks a volume).
		grown, err := d.store.ExpandVolume(ctx, v.ID, size)
		if err != nil {
			return 0, fmt.Errorf("grow backing file: %w", err)
		}
		v = grown
	}
	be := d.deviceBackend(v)
	if be == nil {
		return 0, fmt.Errorf("resize device: staged on a %s device, which this plugin does not serve: %w", v.Node.Backend, blockdev.ErrBusy)
	}
	if err := be.Resize(ctx, v.ID, v.SizeBytes); err != nil {
		return 0, fmt.Errorf("resize device: %w", err)
	}
	if ns.Block {
		return v.SizeBytes, nil
	}
	// resize2fs decides whether to grow online by finding the device in
	// the mount table, which names the kernel node, not our link.
	dev, err := filepath.EvalSymlinks(ns.Device)
	if err != nil {
		return 0, fmt.Errorf("resolve %s: %w", ns.Device, err)
	}
	if _, err := mount.NewResizeFs(d.exec).Resize(dev, ns.StagingPath); err != nil {
		return 0, fmt.Errorf("grow %s filesystem: %w", ns.FsType, err)
	}
	return v.SizeBytes, nil
}
