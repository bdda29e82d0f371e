package driver

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TopologyKey is the topology segment every volume is accessible under.
const TopologyKey = "topology.fastblk.csi.io/node"

// Config is the driver's configuration; cmd/csi-fastblk binds flags to it.
type Config struct {
	Name    string // CSI driver name, e.g. fastblk.csi.io
	Version string
	NodeID  string
	// MaxVolumesPerNode is reported by NodeGetInfo (0 = no limit).
	MaxVolumesPerNode int64
	// Tuning is the node-wide default device tuning (zero = auto).
	Tuning blockdev.Tuning
	// ControllerExpansion advertises ControllerExpandVolume. In a cluster
	// it needs Peers: external-resizer has no per-node mode, so its one
	// leader asks its own node's plugin to grow volumes that live on other
	// nodes, which forwards them. With it off, the resizer only records
	// the new size and NodeExpandVolume, which runs on the volume's node,
	// grows the file, the device and the filesystem.
	ControllerExpansion bool
	// Peers forwards ControllerModifyVolume and ControllerExpandVolume for
	// other nodes' volumes to their plugins, and pulls the data of other
	// nodes' snapshots and volumes for restores and clones (nil: refused
	// with FailedPrecondition and ResourceExhausted).
	Peers Forwarder
	// NoPeerData says the installation's plugins send no data to each
	// other (--peer-serve-data=false): a restore or clone whose source
	// is on another node is not pulled but pinned to the source's node
	// (ResourceExhausted), unless its class hands it off.
	NoPeerData bool
	// PeerAuthz authorizes peers' calls by the API server's objects
	// (peerauthz.go); nil authorizes every call of an authenticated
	// peer, as in tests without an API server.
	PeerAuthz PeerAuthorizer
	// PeerMetadata serves the SnapshotMetadata calls other nodes forward
	// for this node's snapshots (--peer-serve-metadata); off, they are
	// PermissionDenied.
	PeerMetadata bool
	// Handoffs bound the volumes handoffs of one peer make here before
	// their PVs come (handoff.go).
	Handoffs HandoffLimits
	// FormerBackends are backends of other kinds whose devices may still
	// serve volumes staged before a restart onto this plugin's backend
	// (serve passes the loop backend when it runs ublk): such a volume
	// keeps its device until it is unstaged (deviceBackend).
	FormerBackends []blockdev.Backend
	// NoCapacity is told why GetCapacity gives a StorageClass no
	// capacity on this node (nil: only the log at -v=4 says).
	NoCapacity NoCapacityReporter
	// LoopBecause says why the node serves loop devices where ublk was
	// asked for (--backend auto fell back), for the messages of what
	// only ublk can do ("": it did not fall back).
	LoopBecause string
	// CopyBudget is the share of an in-use volume's IOPS this node's
	// background copies (restores, clones, streams to and from peers)
	// may cost it (pacing.go): 0 for copypace.DefaultBudget, negative
	// for none (copies bounded by their rates alone).
	CopyBudget float64
}

// NoCapacityReporter is told, by GetCapacity, why this node gives the
// StorageClass of params no capacity, so that users see it where they
// look: the scheduler only says that no node had enough free storage.
// It must not block.
type NoCapacityReporter interface {
	NoCapacity(params map[string]string, why string)
}

var driverNameRE = regexp.MustCompile(`^[a-zA-Z][A-Za-z0-9-._]{0,61}[a-zA-Z]$`)

// Driver implements the three CSI services. Create it with New.
type Driver struct {
	cfg     Config
	store   *classes // the device classes' stores (classes.go)
	backend blockdev.Backend
	mounter *mount.SafeFormatAndMount
	exec    utilexec.Interface
	locks   *keyLocks
	tag     string // this node's tag in volume and snapshot IDs (ids.go)
	pulls   pulls  // copies in flight from other nodes (pull.go)
	// peerCopies are the copies of this node's volumes peers pull
	// (peercopy.go).
	peerCopies peerCopies
	handoffs   handoffs // volumes being made for peers (handoff.go)
	// copies paces this node's background copies (pacing.go).
	copies *copypace.Governor
	// readiness is set before serving (AddReadinessCheck), read only after.
	readiness []readinessCheck
	// snapMeta is this node's own SnapshotMetadata service, for its own
	// snapshots (nil: the plugin offers none); the CSI socket serves it
	// routed (snapmeta_route.go).
	snapMeta csi.SnapshotMetadataServer
	// keptVolumes: SetKept's, for the status.
	keptMu      sync.Mutex
	keptVolumes map[string]string
	// stopping ends when the plugin stops (stop, by HandOver): calls
	// waiting for a volume's lock then fail.
	stopping context.Context
	stop     context.CancelFunc
}

// New validates cfg and returns a Driver over store and backend.
func New(cfg Config, store *store.Store, backend blockdev.Backend) (*Driver, error) {
	if !driverNameRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("driver name %q: must be a DNS-like name of at most 63 characters", cfg.Name)
	}
	if cfg.NodeID == "" {
		return nil, errors.New("node ID is empty")
	}
	if store == nil || backend == nil {
		return nil, errors.New("store and backend are required")
	}
	ex := utilexec.New()
	d := &Driver{
		cfg:     cfg,
		store:   &classes{def: store},
		backend: backend,
		mounter: &mount.SafeFormatAndMount{Interface: mount.New(""), Exec: ex},
		exec:    ex,
		locks:   newKeyLocks(),
		tag:     nodeTag(cfg.NodeID),
	}
	d.snapMeta = &SnapshotMetadata{d: d}
	d.stopping, d.stop = context.WithCancel(context.Background())
	d.copies = copypace.New(copypace.Config{Devices: d.attachedDevices, Budget: cfg.CopyBudget})
	return d, nil
}

// Reconcile brings devices back in line with persisted node state after a
// restart: every staged volume gets its device again (Attach is idempotent,
// so devices that survived are adopted, not recreated). Each volume is
// locked and re-read, so a Reconcile retried while the node serves never
// races a NodeUnstageVolume.
func (d *Driver) Reconcile(ctx context.Context) error {
	var errs []error
	for _, v := range d.store.Volumes() {
		if v.Node.StagingPath == "" {
			continue
		}
		if err := d.reattach(ctx, v.ID); err != nil {
			errs = append(errs, fmt.Errorf("reattach %s: %w", v.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (d *Driver) reattach(ctx context.Context, id string) error {
	v, unlock, err := d.lockedVolume(ctx, id)
	if status.Code(err) == codes.NotFound {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	defer unlock()
	if v.Node.StagingPath == "" {
		return nil // unstaged meanwhile
	}
	switch be := d.deviceBackend(v); {
	case be == nil:
		return fmt.Errorf("staged on a %s device, which this plugin (backend %s) does not serve: its I/O waits for a plugin "+
			"that does; a second device on its file is refused; unstage it (delete its pod) to move it to %s: %w",
			v.Node.Backend, d.backend.Name(), d.backend.Name(), blockdev.ErrBusy)
	case be != d.backend:
		if dev, err := findDeviceOf(ctx, be, v.ID); err != nil || dev != nil {
			// Its pod may use it: it keeps it (a second device on its
			// file would leave the pod's writes out of every hold and
			// change record) until the volume is unstaged.
			klog.InfoS("volume kept on the device it was staged with before the restart; it moves to this backend at its next stage",
				"volumeID", v.ID, "backend", v.Node.Backend, "device", v.Node.Device, "err", err)
			return err
		}
		// Gone (a reboot): nothing uses it; a device of this backend
		// takes its place.
	}
	dev, err := d.attach(ctx, v)
	if err != nil {
		return err
	}
	keepAllocated(v, dev)
	if ns := v.Node; ns.Backend != dev.Backend || ns.Device != devicePath(dev) {
		ns.Backend, ns.Device, ns.Tuning = dev.Backend, devicePath(dev), dev.Tuning
		if _, err := d.store.UpdateNode(ctx, v.ID, ns); err != nil {
			return errors.Join(fmt.Errorf("record the volume's new device: %w", err), d.detach(ctx, v.ID))
		}
	}
	klog.InfoS("volume device restored", "volumeID", v.ID, "device", dev.Path, "link", dev.Link)
	return nil
}

// deviceBackend returns the backend whose device serves v: this plugin's,
// or, for a volume staged through another kind of device before a restart
// onto this backend, that kind's (Config.FormerBackends: a loop device,
// which the kernel serves without the plugin), which serves it until it is
// unstaged. nil for a volume staged on a kind of device this plugin cannot
// reach (a ublk device while it runs loop).
func (d *Driver) deviceBackend(v blockdev.Volume) blockdev.Backend {
	kind := v.Node.Backend
	if v.Node.StagingPath == "" || kind == "" || kind == d.backend.Name() {
		return d.backend
	}
	for _, b := range d.cfg.FormerBackends {
		if b.Name() == kind {
			return b
		}
	}
	return nil
}

func (d *Driver) attachRequest(v blockdev.Volume) blockdev.AttachRequest {
	t := d.cfg.Tuning
	if p, err := tuningFromParams(v.Params); err == nil {
		if p.Queues != 0 {
			t.Queues = p.Queues
		}
		if p.QueueDepth != 0 {
			t.QueueDepth = p.QueueDepth
		}
		if p.MaxIOBytes != 0 {
			t.MaxIOBytes = p.MaxIOBytes
		}
	}
	lim, _ := limitsOf(v) // checked when the volume was created or modified
	return blockdev.AttachRequest{
		VolumeID:      v.ID,
		File:          d.store.VolumeFile(v.ID),
		SizeBytes:     v.SizeBytes,
		Tuning:        t,
		Limits:        lim,
		KeepAllocated: v.Preallocated(),
	}
}

// limitSetter returns the backend's live rate-limit control, nil when it
// cannot enforce rate limits (the loop device).
func (d *Driver) limitSetter() blockdev.LimitSetter {
	ls, _ := d.backend.(blockdev.LimitSetter)
	return ls
}

// checkLimits refuses rate limits on a node whose backend cannot enforce
// them: a volume would otherwise be created and then fail to stage.
func (d *Driver) checkLimits(v blockdev.Volume) error {
	lim, err := limitsOf(v)
	if err != nil {
		return err
	}
	if !lim.IsZero() && d.limitSetter() == nil {
		why := ""
		if d.cfg.LoopBecause != "" {
			why = " (" + d.cfg.LoopBecause + ")"
		}
		return fmt.Errorf("rate limits (%s, %s) need the ublk backend; this node serves volumes with %s%s",
			ParamMaxIOPS, ParamMaxBandwidth, d.backend.Name(), why)
	}
	return nil
}

// lockVolume serialises calls on one volume ID. Once the plugin stops
// (HandOver keeps every staged volume's lock: nothing may change a volume
// after its change record was handed over), a call for a volume, waiting
// or new, fails with Unavailable.
func (d *Driver) lockVolume(ctx context.Context, id string) (func(), error) {
	if d.stopping.Err() != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %s: the plugin is stopping", id)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.stopping, cancel)()
	unlock, err := d.locks.lock(waitCtx, "volume/"+id)
	switch {
	case err != nil && d.stopping.Err() != nil && ctx.Err() == nil:
		return nil, status.Errorf(codes.Unavailable, "wait for volume %s: the plugin is stopping", id)
	case err != nil:
		return nil, toStatus(fmt.Errorf("wait for volume %s: %w", id, err))
	}
	return unlock, nil
}

// lockedVolume locks the volume and returns its record; the caller runs the
// returned unlock when done. Unknown volumes give NotFound, unlocked.
func (d *Driver) lockedVolume(ctx context.Context, id string) (blockdev.Volume, func(), error) {
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return blockdev.Volume{}, nil, err
	}
	v, err := d.store.Volume(id)
	if err != nil {
		unlock()
		return blockdev.Volume{}, nil, toStatus(err)
	}
	return v, unlock, nil
}
