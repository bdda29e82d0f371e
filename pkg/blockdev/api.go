package blockdev

import (
	"context"
	"maps"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// Volume is the persisted record of one volume. The Store returns copies;
// changing a returned Volume changes nothing until it is passed to Update.
type Volume struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	SizeBytes int64             `json:"sizeBytes"`
	Params    map[string]string `json:"params,omitempty"`
	// MutableParams are the parameters that may change over the
	// volume's life (CSI mutable parameters, from a Kubernetes
	// VolumeAttributesClass); they override Params of the same name.
	MutableParams map[string]string `json:"mutableParams,omitempty"`
	// SourceSnapshotID or SourceVolumeID is set when the volume was
	// created from a snapshot or cloned from another volume.
	SourceSnapshotID string `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string `json:"sourceVolumeID,omitempty"`
	// SourceNode is the tag of the node the source lives on (as in CSI
	// IDs) when that is not this node: the data was pulled from there
	// over the peer channel. Empty for a local source.
	SourceNode string    `json:"sourceNode,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	// HandoffPeer is the node whose CreateVolume this node took over (a
	// handoff over the peer channel) until the volume's PV was seen:
	// such a volume whose PV never comes is removed (pkg/driver,
	// handoff.go). Not part of the volume's identity.
	HandoffPeer string `json:"handoffPeer,omitempty"`
	// Preallocation says how the backing file takes its disk blocks:
	// all at create and at each expansion, or ("") as it is written.
	Preallocation Preallocation `json:"preallocation,omitempty"`

	// Node-side state, persisted so that a restarted plugin knows what
	// it staged and published.
	Node NodeState `json:"node,omitempty"`
}

// Preallocation is how a volume's backing file takes its disk blocks.
type Preallocation string

const (
	// PreallocOff: sparse, every block is allocated by the first write
	// into it.
	PreallocOff Preallocation = ""
	// PreallocFalloc allocates the whole file (fallocate mode 0) at
	// create and at each expansion: the space is the volume's, no
	// write can fail for want of it. ext4 and xfs record the blocks as
	// unwritten, so a first write into one still converts its extent,
	// which costs about what an allocation does.
	PreallocFalloc Preallocation = "falloc"
	// PreallocFull allocates the whole file and writes zeros over it,
	// so that a first write is an overwrite of a written block: first
	// writes are as fast as any write. Creating and expanding write the
	// whole range once.
	PreallocFull Preallocation = "full"
)

// Preallocated reports whether the volume's file has all its blocks.
func (v Volume) Preallocated() bool { return v.Preallocation != PreallocOff }

// WithMutableParams returns v with its mutable parameters updated by params:
// each replaces the one of the same name, an empty value removes it. The
// copy has its own MutableParams and shares v's other maps.
func (v Volume) WithMutableParams(params map[string]string) Volume {
	m := maps.Clone(v.MutableParams)
	if m == nil {
		m = map[string]string{}
	}
	for k, val := range params {
		if val == "" {
			delete(m, k)
		} else {
			m[k] = val
		}
	}
	if len(m) == 0 {
		m = nil
	}
	v.MutableParams = m
	return v
}

// EffectiveParams returns the volume's parameters with the mutable ones on
// top, in a new map.
func (v Volume) EffectiveParams() map[string]string {
	p := maps.Clone(v.Params)
	if p == nil {
		p = map[string]string{}
	}
	maps.Copy(p, v.MutableParams)
	return p
}

// Keys of the claim metadata the external-provisioner adds to CreateVolume
// parameters with --extra-create-metadata; they stay in Volume.Params.
const (
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParamPVName       = "csi.storage.k8s.io/pv/name"
)

// Claim returns the namespace and name of the PersistentVolumeClaim the
// volume was provisioned for, as the provisioner passed them at creation;
// both are empty for volumes created without that metadata.
func (v Volume) Claim() (namespace, name string) {
	return v.Params[ParamPVCNamespace], v.Params[ParamPVCName]
}

// NodeState records what the node service did with a volume.
type NodeState struct {
	// StagingPath is where the volume is staged ("" when not staged).
	StagingPath string `json:"stagingPath,omitempty"`
	// Block is true when staged for raw block access.
	Block bool `json:"block,omitempty"`
	// FsType is the filesystem made on the device (mount access only).
	FsType string `json:"fsType,omitempty"`
	// Device is the stable device path (e.g. /dev/fastblk/<id>).
	Device string `json:"device,omitempty"`
	// Backend names the backend that attached it ("loop", "ublk").
	Backend string `json:"backend,omitempty"`
	// Tuning is what the backend chose for the device.
	Tuning Tuning `json:"tuning,omitempty"`
	// Targets maps each published target path to how it was published.
	Targets map[string]Publish `json:"targets,omitempty"`
}

// Publish describes one NodePublishVolume target.
type Publish struct {
	ReadOnly bool `json:"readOnly,omitempty"`
	// SingleWriter is true for SINGLE_NODE_SINGLE_WRITER publications.
	SingleWriter bool `json:"singleWriter,omitempty"`
}

// Snapshot is the persisted record of one snapshot.
type Snapshot struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"sourceVolumeID"`
	SizeBytes      int64     `json:"sizeBytes"`
	CreatedAt      time.Time `json:"createdAt"`
	// GroupID is the group snapshot this snapshot is a member of ("" for
	// a snapshot of its own): it was taken with the group's other
	// members at one instant, and goes with the group.
	GroupID string `json:"groupID,omitempty"`
}

// GroupSnapshot is the persisted record of a group snapshot: snapshots of
// several volumes taken at one instant.
type GroupSnapshot struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Members are the group's snapshots, one per volume, sorted by
	// volume ID.
	Members   []GroupMember `json:"members"`
	CreatedAt time.Time     `json:"createdAt"`
}

// GroupMember is one volume of a group snapshot and its snapshot.
type GroupMember struct {
	VolumeID   string `json:"volumeID"`
	SnapshotID string `json:"snapshotID"`
}

// Tuning is the queue geometry of a device. Zero fields mean "choose".
type Tuning struct {
	Queues     int `json:"queues,omitempty"`
	QueueDepth int `json:"queueDepth,omitempty"`
	// MaxIOBytes is the largest request the device takes, in bytes. In
	// copy mode each tag has a buffer this big, so it trades memory for
	// large-I/O throughput; zero copy always takes 1 MiB.
	MaxIOBytes int `json:"maxIOBytes,omitempty"`
}

// Device is a block device that exposes one volume.
type Device struct {
	VolumeID string
	// Path is the kernel device node, e.g. /dev/loop3 or /dev/ublkb2.
	Path string
	// Link is the stable path, <dev-dir>/<volume-id>, a symlink to Path.
	// Callers use Link; kernel names can change across re-attachments.
	Link string
	// Backend names the backend that made it.
	Backend string
	Tuning  Tuning
	// Limits are the rate limits in force on the device.
	Limits qos.Limits
	// SizeBytes is the size the kernel reports for the device.
	SizeBytes int64
}

// AttachRequest asks a backend to expose a volume file as a block device.
type AttachRequest struct {
	VolumeID string
	// File is the volume's backing file.
	File      string
	SizeBytes int64
	ReadOnly  bool
	Tuning    Tuning
	// Limits pace the device's reads and writes (zero: unlimited). A
	// backend that cannot enforce them refuses the attach with
	// ErrNotSupported; one that can applies them to a device that is
	// already attached.
	Limits qos.Limits
	// KeepAllocated says the file's blocks must stay allocated (a
	// preallocated volume): a backend that can zeroes ranges in place
	// instead of punching them out of the file.
	KeepAllocated bool
}

// Backend turns volume files into block devices.
//
// Implementations are safe for concurrent use on different volumes; callers
// serialise calls for the same volume.
type Backend interface {
	// Name is a short identifier ("loop", "ublk").
	Name() string
	// Attach exposes the file as a block device. It is idempotent: when
	// a device for req.VolumeID already exists it is returned unchanged.
	Attach(ctx context.Context, req AttachRequest) (Device, error)
	// Detach removes the volume's device. Detach of a volume with no
	// device returns nil.
	Detach(ctx context.Context, volumeID string) error
	// Resize makes the device report sizeBytes after the backing file
	// has grown. It returns an error wrapping ErrNotSupported when the
	// kernel cannot resize an attached device, and ErrNotFound when the
	// volume has no device.
	Resize(ctx context.Context, volumeID string, sizeBytes int64) error
	// List returns every device this backend made for this data
	// directory, including those found again after a restart.
	List(ctx context.Context) ([]Device, error)
	// Close releases the backend's resources without detaching devices
	// (devices outlive the process where the backend allows it).
	Close() error
}

// IOHolder is implemented by backends that can hold a device's I/O while a
// snapshot or clone of its backing file is taken; the driver uses it for
// volumes in use, a mounted volume's after its filesystem is frozen (see
// package quiesce for the choice).
//
// HoldIO returns once every write the device has completed is in the
// backing file (flushed, as for a FLUSH request) and, until release is
// called, no request reaches the backing file: new requests wait, they are
// neither failed nor lost. A copy made in between is then crash-consistent.
// release lets the held requests through; calling it more than once is
// safe. HoldIO of a volume with no device returns an error wrapping
// ErrNotFound. The caller serialises HoldIO and release with the volume's
// other calls.
//
// The loop backend does not implement it: the kernel offers no way to hold
// a loop device's requests from user space (its queue is frozen only inside
// its own ioctls, LOOP_SET_STATUS, LOOP_SET_BLOCK_SIZE and the like, never
// across calls), so a raw block loop volume in use is flushed with
// quiesce.FlushDevice and copied by a single reflink, or not at all.
type IOHolder interface {
	HoldIO(ctx context.Context, volumeID string) (release func() error, err error)
}

// IOStats are a backend's own measurements of one device, beyond the
// kernel's disk counters: latency distribution, device state, recoveries.
type IOStats struct {
	// State is the device's state as the backend sees it ("live",
	// "quiesced", "recovering", "failed", "dead"); Reason says why a
	// device is not live, where the backend knows.
	State  string
	Reason string
	// Recoveries counts how often the plugin's process re-adopted the
	// device: after a plugin restart, and after its server thread failed.
	Recoveries uint64
	// Errors counts I/Os completed with an error.
	Errors uint64
	// InFlight is the number of I/Os the server holds right now.
	InFlight int64
	// LatencyBounds are the histogram's upper bounds in seconds and
	// LatencyCounts the cumulative counts per bound (Prometheus style);
	// LatencySum is the sum of all latencies in seconds and
	// LatencyCount their number.
	LatencyBounds []float64
	LatencyCounts []uint64
	LatencySum    float64
	LatencyCount  uint64
	// Throttled counts requests the rate limits held back, and
	// ThrottledSeconds the time they waited.
	Throttled        uint64
	ThrottledSeconds float64
}

// LimitSetter is implemented by backends that can change the rate limits of
// an attached device in place. An unattached volume gives ErrNotFound.
type LimitSetter interface {
	SetLimits(ctx context.Context, volumeID string, lim qos.Limits) error
}

// HealthReporter is implemented by backends whose devices can stop being
// served while the process runs (the ublk server's threads can fail):
// Health returns why some device holds its I/O, nil when every device is
// served. The plugin's health check fails with it, so that the kubelet
// restarts a plugin that cannot heal itself.
type HealthReporter interface {
	Health() error
}

// IOStatser is implemented by backends that measure their devices' I/O
// themselves (the ublk server does; the kernel loop device does not).
type IOStatser interface {
	IOStats(volumeID string) (IOStats, bool)
}

// Quarantiner is implemented by what sets aside records it cannot read
// (the Store, the ublk backend): Quarantined lists their paths. Each needs
// an operator: the object it describes is out of service, its data and
// device kept, until the record is restored or removed.
type Quarantiner interface {
	Quarantined() []string
}
