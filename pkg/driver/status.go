package driver

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/blkdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cgroup"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// NodeStatus is what the plugin reports about its node: served at /status
// and shown by `csi-fastblk status`; the metrics collector reads it too.
type NodeStatus struct {
	Driver      string `json:"driver"`
	Version     string `json:"version"`
	NodeID      string `json:"nodeID"`
	Kernel      string `json:"kernel"`
	Backend     string `json:"backend"`
	Healthy     bool   `json:"healthy"`
	HealthError string `json:"healthError,omitempty"`
	// HealthSummary is HealthError without host paths (HealthSummary),
	// for /healthz on the network.
	HealthSummary string `json:"healthSummary,omitempty"`
	// Classes are the node's device classes, the default first, then
	// those it cannot serve.
	Classes   []ClassStatus  `json:"classes"`
	Volumes   []VolumeStatus `json:"volumes"`
	Snapshots int            `json:"snapshots"`
	// PidsHeadroom is how many more tasks the plugin's cgroup may start
	// under its pids limit (cgroup.PidsHeadroom); nil when there is no
	// limit. Each ublk queue is two of them.
	PidsHeadroom *int64 `json:"pidsHeadroom,omitempty"`
	// Quarantined are the records (volume metadata, ublk device states)
	// set aside because they could not be read (blockdev.Quarantiner):
	// their objects are out of service until an operator acts.
	Quarantined []string `json:"quarantined,omitempty"`
	// Held maps each volume whose device the backend keeps but does not
	// serve (blockdev.HeldReporter) to why. The plugin stays healthy
	// (a restart would not resolve it); an operator must act.
	Held map[string]string `json:"held,omitempty"`
	// FailingIO maps each device the backend keeps but cannot serve,
	// and whose I/O it fails instead of holding it
	// (blockdev.FailingReporter), to since when (RFC 3339).
	FailingIO map[string]string `json:"failingIO,omitempty"`
	// Pulls are the copies from other nodes in flight (restores and
	// clones whose source lives elsewhere).
	Pulls []PullStatus `json:"pulls,omitempty"`
	// Kept maps each volume (CSI ID) that the node keeps though no claim
	// uses it to why, as found at start (pkg/nodeloss: its claim was
	// released while the node was deleted, or no PV names it).
	Kept map[string]string `json:"kept,omitempty"`
	// CopyPacing is how this node's background copies are paced by
	// what they cost its volumes in use (pacing.go).
	CopyPacing copypace.Status `json:"copyPacing"`
}

// ClassStatus describes one device class: its directory and what it can
// still provision, or why the node cannot serve it.
type ClassStatus struct {
	Name              string `json:"name"`
	Path              string `json:"path"`
	CapacityAvailable int64  `json:"capacityAvailable"`
	CapacityTotal     int64  `json:"capacityTotal"`
	// FilesystemFree is what the directory's filesystem has free (for
	// unprivileged users), whatever volumes were promised.
	FilesystemFree int64 `json:"filesystemFree"`
	Volumes        int   `json:"volumes"`
	Snapshots      int   `json:"snapshots"`
	// Unavailable: the node cannot serve the class, for Error; its
	// volumes, the CSI IDs in Stranded (found in its directory), are out
	// of service, their files kept, until it can. A served class has an
	// Error when its capacity cannot be read.
	Unavailable bool     `json:"unavailable,omitempty"`
	Error       string   `json:"error,omitempty"`
	Stranded    []string `json:"stranded,omitempty"`
}

// VolumeStatus describes one volume and, when attached, its device.
type VolumeStatus struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Class is the volume's device class.
	Class     string `json:"class"`
	SizeBytes int64  `json:"sizeBytes"`
	// AllocatedBytes is the disk space the volume's sparse file takes.
	AllocatedBytes int64 `json:"allocatedBytes"`
	// PVC and PV name the Kubernetes objects of the volume, from the
	// parameters the external-provisioner adds (--extra-create-metadata);
	// empty for volumes created without them.
	PVCNamespace string          `json:"pvcNamespace,omitempty"`
	PVCName      string          `json:"pvcName,omitempty"`
	PVName       string          `json:"pvName,omitempty"`
	StagingPath  string          `json:"stagingPath,omitempty"`
	Access       string          `json:"access,omitempty"`
	FsType       string          `json:"fsType,omitempty"`
	Targets      int             `json:"targets"`
	Device       string          `json:"device,omitempty"`
	Link         string          `json:"link,omitempty"`
	Backend      string          `json:"backend,omitempty"`
	Tuning       blockdev.Tuning `json:"tuning"`
	// Limits are the volume's rate limits: those in force on its device
	// when attached, else those recorded.
	Limits qos.Limits        `json:"limits,omitzero"`
	Disk   *blkdev.Stats     `json:"disk,omitempty"`
	IO     *blockdev.IOStats `json:"io,omitempty"`
}

// Status gathers the node's status: volumes from the store, devices from the
// backend, I/O counters from the kernel and the backend.
func (d *Driver) Status(ctx context.Context) (NodeStatus, error) {
	st := NodeStatus{
		Driver:  d.cfg.Name,
		Version: d.cfg.Version,
		NodeID:  d.cfg.NodeID,
		Kernel:  kernel.Release(),
		Backend: d.backend.Name(),
		Healthy: true,
	}
	if err := d.Healthy(ctx); err != nil {
		st.Healthy, st.HealthError, st.HealthSummary = false, err.Error(), HealthSummary(err)
	}
	st.Classes = d.ClassStatus()
	st.Snapshots = len(d.store.Snapshots())
	st.Pulls = d.pullStatus()
	st.Kept = d.kept()
	st.CopyPacing = d.copies.Status()
	st.Quarantined = d.store.Quarantined()
	if q, ok := d.backend.(blockdev.Quarantiner); ok {
		st.Quarantined = append(st.Quarantined, q.Quarantined()...)
	}
	if h, ok := d.backend.(blockdev.HeldReporter); ok {
		for id, err := range h.Held() {
			if st.Held == nil {
				st.Held = map[string]string{}
			}
			st.Held[id] = err.Error()
		}
	}
	if f, ok := d.backend.(blockdev.FailingReporter); ok {
		for dev, since := range f.FailingIO() {
			if st.FailingIO == nil {
				st.FailingIO = map[string]string{}
			}
			st.FailingIO[dev] = since.UTC().Format(time.RFC3339)
		}
	}
	if room, err := cgroup.PidsHeadroom(os.Getpid()); err == nil && room >= 0 {
		st.PidsHeadroom = &room
	}
	devs, err := d.backend.List(ctx)
	if err != nil {
		return st, fmt.Errorf("list devices: %w", err)
	}
	for _, b := range d.cfg.FormerBackends {
		if former, err := b.List(ctx); err == nil {
			devs = append(devs, former...)
		}
	}
	byVolume := map[string]blockdev.Device{}
	for _, dev := range devs {
		if _, ok := byVolume[dev.VolumeID]; !ok {
			byVolume[dev.VolumeID] = dev
		}
	}
	statser, _ := d.backend.(blockdev.IOStatser)
	for _, v := range d.store.Volumes() {
		_, class := d.store.of(v.ID)
		vs := VolumeStatus{ID: v.ID, Name: v.Name, Class: class, SizeBytes: v.SizeBytes, StagingPath: v.Node.StagingPath,
			FsType: v.Node.FsType, Targets: len(v.Node.Targets), Tuning: v.Node.Tuning, PVName: v.Params[ParamPVName]}
		vs.PVCNamespace, vs.PVCName = v.Claim()
		vs.AllocatedBytes, _ = fsstat.AllocatedBytes(d.store.VolumeFile(v.ID))
		vs.Limits, _ = limitsOf(v)
		if v.Node.StagingPath != "" {
			vs.Access = accessName(v.Node.Block)
		}
		if dev, ok := byVolume[v.ID]; ok {
			vs.Device, vs.Link, vs.Backend, vs.Tuning, vs.Limits = dev.Path, dev.Link, dev.Backend, dev.Tuning, dev.Limits
			if ds, err := blkdev.ReadStats(dev.Path); err == nil {
				vs.Disk = &ds
			}
			if statser != nil {
				if io, ok := statser.IOStats(v.ID); ok {
					vs.IO = &io
				}
			}
		}
		st.Volumes = append(st.Volumes, vs)
	}
	return st, nil
}

// ClassStatus describes every device class: those served, then those the
// node cannot serve, by name.
func (d *Driver) ClassStatus() []ClassStatus {
	var out []ClassStatus
	d.store.each(func(name string, s *store.Store) {
		cs := ClassStatus{Name: name, Path: s.Dir(), Volumes: len(s.Volumes()), Snapshots: len(s.Snapshots())}
		var err error
		if cs.CapacityAvailable, cs.CapacityTotal, err = s.Capacity(); err != nil {
			cs.Error = err.Error()
		}
		if fs, err := fsstat.Stat(s.Dir()); err == nil {
			cs.FilesystemFree = fs.AvailableBytes
		}
		out = append(out, cs)
	})
	for _, name := range slices.Sorted(maps.Keys(d.store.down)) {
		dc := d.store.down[name]
		cs := ClassStatus{Name: name, Path: dc.path, Volumes: len(dc.volumes), Unavailable: true, Error: dc.why.Error()}
		for _, id := range dc.volumes {
			cs.Stranded = append(cs.Stranded, d.publicIDIn(id, name))
		}
		out = append(out, cs)
	}
	return out
}
