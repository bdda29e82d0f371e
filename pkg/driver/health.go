package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/mountinfo"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// Volume and storage health (CSI v1.13 alpha RPCs). Every check reads real
// state: the backing file, the backend's device list, the stable link, the
// mount table and the data directory's filesystem. Gathering (the *Facts
// functions) is kept apart from judging (volumeFileHealth, nodeVolumeHealth,
// storageHealth), which are pure and table-tested.

// lowSpacePercent is the free space of the data directory, in percent of
// its size, below which storage health reports LowSpace.
const lowSpacePercent = 5

// Reasons, CamelCase as the spec asks. Each appears at most once per
// volume (or per storage report), so (status, reason) never repeats.
const (
	reasonFileMissing     = "BackingFileMissing"
	reasonFileUnreadable  = "BackingFileUnreadable"
	reasonFileTruncated   = "BackingFileTruncated"
	reasonSizeMismatch    = "SizeMismatch"
	reasonBackendDown     = "BackendUnavailable"
	reasonDeviceMissing   = "DeviceMissing"
	reasonDeviceState     = "DeviceNotLive"
	reasonDeviceHeld      = "DeviceHeld"
	reasonDeviceFailing   = "DeviceFailingIO"
	reasonLinkBroken      = "DeviceLinkBroken"
	reasonStagingUnmount  = "StagingNotMounted"
	reasonStagingWrongDev = "StagingWrongDevice"
	reasonFilesystemRO    = "FilesystemReadOnly"
	reasonFilesystemErr   = "FilesystemErrors"
	reasonTargetUnmount   = "TargetNotMounted"
	reasonNotStaged       = "NotStaged"
	reasonNotPublished    = "NotPublished"
	reasonDataDirGone     = "DataDirUnavailable"
	reasonDataDirRO       = "DataDirReadOnly"
	reasonDataDirNoWrite  = "DataDirNotWritable"
	reasonLowSpace        = "LowSpace"
	reasonClassDown       = "DeviceClassUnavailable"
)

const (
	dataLoss        = csi.VolumeHealthErrorType_DATA_LOSS
	inaccessible    = csi.VolumeHealthErrorType_INACCESSIBLE
	degraded        = csi.VolumeHealthErrorType_DEGRADED
	storageDegraded = csi.StorageHealthErrorType_STORAGE_DEGRADED
	unreachable     = csi.StorageHealthErrorType_STORAGE_UNREACHABLE
)

type volumeEntry = csi.VolumeHealth_VolumeHealthEntry
type storageEntry = csi.NodeGetStorageHealthResponse_StorageBackendHealth

// volEntry makes a one-entry list; callers append them.
func volEntry(st csi.VolumeHealthErrorType, reason, format string, args ...any) []*volumeEntry {
	return []*volumeEntry{{Status: st, Reason: reason, Message: fmt.Sprintf(format, args...)}}
}

func storEntry(st csi.StorageHealthErrorType, reason, format string, args ...any) *storageEntry {
	return &storageEntry{Status: st, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// fileFacts is what stat says about a volume's backing file.
type fileFacts struct {
	path string
	size int64
	err  error
}

func statFile(path string) fileFacts {
	fi, err := os.Stat(path)
	if err != nil {
		return fileFacts{path: path, err: err}
	}
	return fileFacts{path: path, size: fi.Size()}
}

// volumeFileHealth judges the backing file against the volume's record.
func volumeFileHealth(v blockdev.Volume, f fileFacts) []*volumeEntry {
	switch {
	case errors.Is(f.err, os.ErrNotExist):
		return volEntry(dataLoss, reasonFileMissing,
			"backing file %s of volume %s is missing; restore the volume from a snapshot", f.path, v.ID)
	case f.err != nil:
		return volEntry(inaccessible, reasonFileUnreadable, "backing file %s of volume %s: %v", f.path, v.ID, f.err)
	case f.size < v.SizeBytes:
		return volEntry(dataLoss, reasonFileTruncated,
			"backing file %s has %d bytes but volume %s has %d; data past byte %d is lost", f.path, f.size, v.ID, v.SizeBytes, f.size)
	case f.size > v.SizeBytes:
		return volEntry(degraded, reasonSizeMismatch,
			"backing file %s has %d bytes but volume %s is recorded with %d (an interrupted expansion?); expand it again",
			f.path, f.size, v.ID, v.SizeBytes)
	}
	return nil
}

// nodeFacts is what the node sees of one volume.
type nodeFacts struct {
	file        fileFacts
	backend     string
	listErr     error
	device      *blockdev.Device // the backend's device for the volume; nil when it lists none
	devNum      string           // device's major:minor, "" when unknown
	state       string           // the backend's own view of the device, "" when it has none
	stateReason string           // why, when it is not live
	held        error            // why the backend keeps the volume's device unserved (blockdev.HeldReporter)
	link        string           // where the recorded device path leads, or linkErr
	linkErr     error
	// mounts maps the staging path and each target to the topmost mount
	// there; a path that is not a mount point has no key.
	mounts   map[string]mountinfo.MountInfo
	fsErrors fsstat.ErrorRecord // the staged filesystem's own error record
	// staging and target are the paths the request named ("" for none).
	staging, target string
}

// nodeVolumeHealth judges a volume as the node sees it.
func nodeVolumeHealth(v blockdev.Volume, f nodeFacts) []*volumeEntry {
	out := volumeFileHealth(v, f.file)
	out = append(out, requestedPathHealth(v.Node, f.staging, f.target)...)
	if v.Node.StagingPath != "" {
		out = append(out, deviceHealth(v.Node, f)...)
		out = append(out, stagingHealth(v.Node, f)...)
	}
	return append(out, targetHealth(v.Node, f.mounts)...)
}

// requestedPathHealth reports paths the CO asked about that the volume is
// not staged or published at (the spec lets it ask after a failed attempt).
func requestedPathHealth(ns blockdev.NodeState, staging, target string) []*volumeEntry {
	var out []*volumeEntry
	switch {
	case staging == "" || staging == ns.StagingPath:
	case ns.StagingPath == "":
		out = volEntry(inaccessible, reasonNotStaged, "volume is not staged on this node (asked about %s)", staging)
	default:
		out = volEntry(inaccessible, reasonNotStaged, "volume is staged at %s, not at %s", ns.StagingPath, staging)
	}
	if _, ok := ns.Targets[target]; target != "" && !ok {
		out = append(out, volEntry(inaccessible, reasonNotPublished, "volume is not published at %s", target)...)
	}
	return out
}

// deviceHealth checks that a staged volume still has its device, live, and
// that the recorded (stable) device path still leads to it.
func deviceHealth(ns blockdev.NodeState, f nodeFacts) []*volumeEntry {
	switch {
	case f.listErr != nil:
		return volEntry(inaccessible, reasonBackendDown,
			"volume is staged at %s but the %s backend cannot list devices: %v", ns.StagingPath, f.backend, f.listErr)
	case f.device == nil && errors.Is(f.held, blockdev.ErrFailingIO):
		return volEntry(inaccessible, reasonDeviceFailing,
			"volume is staged at %s; the %s backend cannot tell which of the devices it keeps is its own, and fails the I/O of "+
				"those (its writers get EIO) instead of holding it: %v; restore the volume's record (its device link, or its "+
				"state file), then restart the plugin (csi-fastblk status)", ns.StagingPath, f.backend, f.held)
	case f.device == nil && f.held != nil:
		return volEntry(inaccessible, reasonDeviceHeld,
			"volume is staged at %s; the %s backend keeps its device with its I/O held and does not serve it: %v; "+
				"an operator must check the device against the volume (csi-fastblk status)", ns.StagingPath, f.backend, f.held)
	case f.device == nil:
		return volEntry(inaccessible, reasonDeviceMissing,
			"volume is staged at %s but the %s backend has no device for it (recorded device %s); unstage and stage it again",
			ns.StagingPath, f.backend, ns.Device)
	}
	var out []*volumeEntry
	switch f.state {
	case "", "live", "quiesced":
	case "recovering":
		out = volEntry(degraded, reasonDeviceState, "device %s is recovering; I/O waits until the server re-adopts it", f.device.Path)
	case "failed":
		out = volEntry(inaccessible, reasonDeviceState, "device %s failed (%s); its I/O is held until the plugin re-adopts it (in the process where it can, else after a restart)",
			f.device.Path, f.stateReason)
	default:
		out = volEntry(inaccessible, reasonDeviceState, "device %s is %s", f.device.Path, f.state)
	}
	switch {
	case ns.Device == f.device.Path:
	case f.linkErr != nil:
		out = append(out, volEntry(inaccessible, reasonLinkBroken, "device link %s of device %s: %v", ns.Device, f.device.Path, f.linkErr)...)
	case f.link != f.device.Path:
		out = append(out, volEntry(inaccessible, reasonLinkBroken,
			"device link %s leads to %s, not to the volume's device %s", ns.Device, f.link, f.device.Path)...)
	}
	return out
}

// stagingHealth checks the filesystem of a volume staged for mount access:
// mounted at the staging path from the volume's device, writable unless
// every publication is read-only, and free of recorded errors.
func stagingHealth(ns blockdev.NodeState, f nodeFacts) []*volumeEntry {
	if ns.Block {
		return nil
	}
	m, ok := f.mounts[ns.StagingPath]
	if !ok {
		return volEntry(inaccessible, reasonStagingUnmount,
			"staging path %s is not mounted; the %s filesystem on %s is unreachable", ns.StagingPath, ns.FsType, ns.Device)
	}
	if got := fmt.Sprintf("%d:%d", m.Major, m.Minor); f.device != nil && f.devNum != "" && got != f.devNum {
		return volEntry(inaccessible, reasonStagingWrongDev,
			"staging path %s holds %s (%s), not the volume's device %s (%s)", ns.StagingPath, m.Source, got, f.device.Path, f.devNum)
	}
	var out []*volumeEntry
	if m.ReadOnly() && wantsWrites(ns) {
		out = volEntry(degraded, reasonFilesystemRO,
			"%s filesystem at staging path %s is read-only (mount %s, filesystem %s); writes fail, see the kernel log for %s",
			m.FsType, ns.StagingPath, strings.Join(m.MountOptions, ","), strings.Join(m.SuperOptions, ","), m.Source)
	}
	if e := f.fsErrors; e.Count > 0 {
		out = append(out, volEntry(degraded, reasonFilesystemErr,
			"%s filesystem on %s (staged at %s) recorded %d error(s), the last in %s at %s; unstage it and run e2fsck",
			m.FsType, m.Source, ns.StagingPath, e.Count, e.LastFunc, e.LastTime.Format(time.RFC3339))...)
	}
	return out
}

// wantsWrites: a staged filesystem is expected to be writable unless it is
// published, and only read-only.
func wantsWrites(ns blockdev.NodeState) bool {
	return len(ns.Targets) == 0 || slices.ContainsFunc(slices.Collect(maps.Values(ns.Targets)),
		func(p blockdev.Publish) bool { return !p.ReadOnly })
}

// targetHealth reports published targets that are no longer mount points,
// all in one entry.
func targetHealth(ns blockdev.NodeState, mounts map[string]mountinfo.MountInfo) []*volumeEntry {
	var lost []string
	for _, t := range slices.Sorted(maps.Keys(ns.Targets)) {
		if _, ok := mounts[t]; !ok {
			lost = append(lost, t)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return volEntry(inaccessible, reasonTargetUnmount,
		"published target %s is not mounted; the pod no longer sees the volume", strings.Join(lost, ", "))
}

// nodeFacts gathers what nodeVolumeHealth judges.
func (d *Driver) nodeFacts(ctx context.Context, v blockdev.Volume, staging, target string) (nodeFacts, error) {
	f := nodeFacts{file: statFile(d.store.VolumeFile(v.ID)), backend: d.backend.Name(), staging: staging, target: target}
	var err error
	if f.mounts, err = mountinfo.MountsAt(append(slices.Collect(maps.Keys(v.Node.Targets)), v.Node.StagingPath)...); err != nil {
		return f, err
	}
	if m, ok := f.mounts[v.Node.StagingPath]; ok && m.FsType == "ext4" {
		f.fsErrors, _ = fsstat.Ext4Errors(m.Major, m.Minor) // unreadable: nothing recorded
	}
	if v.Node.StagingPath == "" {
		return f, nil
	}
	f.device, f.listErr = d.findDevice(ctx, v.ID)
	if f.device == nil {
		if h, ok := d.backend.(blockdev.HeldReporter); ok {
			f.held = h.Held()[v.ID]
		}
		return f, nil
	}
	if major, minor, err := blkdev.Number(f.device.Path); err == nil {
		f.devNum = fmt.Sprintf("%d:%d", major, minor)
	}
	if st, ok := d.backend.(blockdev.IOStatser); ok {
		if io, ok := st.IOStats(v.ID); ok {
			f.state, f.stateReason = io.State, io.Reason
		}
	}
	if v.Node.Device != f.device.Path {
		f.link, f.linkErr = filepath.EvalSymlinks(v.Node.Device)
	}
	return f, nil
}

// findDevice returns the volume's device, of this plugin's backend or a
// former one (deviceBackend), or nil when none lists one.
func (d *Driver) findDevice(ctx context.Context, id string) (*blockdev.Device, error) {
	for _, b := range append([]blockdev.Backend{d.backend}, d.cfg.FormerBackends...) {
		if dev, err := findDeviceOf(ctx, b, id); err != nil || dev != nil {
			return dev, err
		}
	}
	return nil, nil
}

// findDeviceOf returns b's device for the volume, or nil when it lists
// none.
func findDeviceOf(ctx context.Context, b blockdev.Backend, id string) (*blockdev.Device, error) {
	devs, err := b.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, dev := range devs {
		if dev.VolumeID == id {
			return &dev, nil
		}
	}
	return nil, nil
}

// storageFacts is what the node sees of its storage: the data directory's
// filesystem and the backend.
type storageFacts struct {
	dir      string
	stats    fsstat.Stats
	statErr  error
	probeErr error
	backend  string
	listErr  error
}

// storageHealth judges the node's storage; no entries means healthy.
func storageHealth(f storageFacts) []*storageEntry {
	var out []*storageEntry
	switch {
	case f.statErr != nil:
		out = append(out, storEntry(unreachable, reasonDataDirGone, "data directory %s: %v", f.dir, f.statErr))
	case f.stats.ReadOnly:
		out = append(out, storEntry(storageDegraded, reasonDataDirRO,
			"data directory %s is on a read-only filesystem: creating volumes and snapshots and writing to volumes fail", f.dir))
	case f.probeErr != nil:
		out = append(out, storEntry(storageDegraded, reasonDataDirNoWrite, "data directory %s does not take writes: %v", f.dir, f.probeErr))
	}
	if st := f.stats; f.statErr == nil && st.AvailableBytes*100 < st.TotalBytes*lowSpacePercent {
		out = append(out, storEntry(storageDegraded, reasonLowSpace,
			"data directory %s has %d of %d bytes free (below %d%%); writes to sparse volumes fail when it runs out",
			f.dir, st.AvailableBytes, st.TotalBytes, lowSpacePercent))
	}
	if f.listErr != nil {
		out = append(out, storEntry(unreachable, reasonBackendDown, "%s backend cannot list its devices: %v", f.backend, f.listErr))
	}
	return out
}

// storageFacts gathers what the node sees of the data directory dir and,
// with list, of the backend.
func (d *Driver) storageFacts(ctx context.Context, dir string, list bool) storageFacts {
	f := storageFacts{dir: dir, backend: d.backend.Name()}
	f.stats, f.statErr = fsstat.Stat(f.dir)
	if f.statErr == nil && !f.stats.ReadOnly {
		f.probeErr = fsstat.ProbeWrite(f.dir)
	}
	if list {
		_, f.listErr = d.backend.List(ctx)
	}
	return f
}

// NodeGetStorageHealth judges every device class's directory, the backend
// once, and names each class the node cannot serve.
func (s *Node) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	var out []*storageEntry
	first := true
	s.d.store.each(func(_ string, st *store.Store) {
		out = append(out, storageHealth(s.d.storageFacts(ctx, st.Dir(), first))...)
		first = false
	})
	for _, name := range slices.Sorted(maps.Keys(s.d.store.down)) {
		dc := s.d.store.down[name]
		out = append(out, storEntry(unreachable, reasonClassDown, "device class %s (%s) cannot be served: %v; %d volumes out of service",
			name, dc.path, dc.why, len(dc.volumes)))
	}
	return &csi.NodeGetStorageHealthResponse{BackendHealth: out}, nil
}

func (s *Node) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id, err := s.d.nodeVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	staging, target := req.GetStagingTargetPath(), req.GetVolumePublishPath()
	for _, p := range []string{staging, target} {
		if err := checkPaths(p); p != "" && err != nil {
			return nil, err
		}
	}
	v, unlock, err := s.d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	f, err := s.d.nodeFacts(ctx, v, staging, target)
	if err != nil {
		return nil, toStatus(fmt.Errorf("volume %s health: %w", id, err))
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{
		VolumeId: req.GetVolumeId(), HealthStatuses: nodeVolumeHealth(v, f)}}, nil
}

func (s *Controller) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume ID is missing")
	}
	id, err := s.d.localID(req.GetVolumeId(), "volume", codes.NotFound)
	if err != nil {
		return nil, err
	}
	h, err := s.d.controllerVolumeHealth(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// controllerVolumeHealth judges the volume's file under the volume lock, so
// that an expansion in flight is not seen half done.
func (d *Driver) controllerVolumeHealth(ctx context.Context, id string) (*csi.VolumeHealth, error) {
	v, unlock, err := d.lockedVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return &csi.VolumeHealth{VolumeId: d.publicID(id), HealthStatuses: volumeFileHealth(v, statFile(d.store.VolumeFile(id)))}, nil
}

// ControllerListVolumeHealth lists only volumes with a health condition, as
// the spec recommends. Volumes are screened without locks and confirmed
// under their lock; the token is an index into the abnormal list.
func (s *Controller) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	var sick []*csi.VolumeHealth
	for _, v := range s.d.store.Volumes() {
		if len(volumeFileHealth(v, statFile(s.d.store.VolumeFile(v.ID)))) == 0 {
			continue
		}
		h, err := s.d.controllerVolumeHealth(ctx, v.ID)
		if status.Code(err) == codes.NotFound {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		if len(h.HealthStatuses) > 0 {
			sick = append(sick, h)
		}
	}
	page, next, err := paginate(sick, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerListVolumeHealthResponse{Entries: page, NextToken: next}, nil
}
