package driver

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// ParamDeviceClass names the device class (a data directory of the node's,
// package devclass) whose store a StorageClass's volumes live in; absent,
// or "default", the plugin's data directory.
const ParamDeviceClass = "deviceClass"

// classes are the node's device classes: a store each, the default
// class's the data directory's. A volume or snapshot lives in one class
// all its life: restores, clones, pulls and snapshots stay in their
// source's class (volumeSpec refuses the others), and CreateVolume refuses
// a name another class holds, so an ID is in one store at most and a call
// naming an ID goes to the store that holds it (of). Calls that make an
// object name the class. The set is fixed before the driver serves.
type classes struct {
	def   *store.Store
	named map[string]*store.Store
	// down are the classes this node cannot serve (configured with a bad
	// directory, or removed while volumes use them), by name.
	down map[string]downClass
}

// downClass is a class this node cannot serve and why; its volumes are
// out of service, their files kept, until it can.
type downClass struct {
	path    string
	why     error
	volumes []string // store IDs of the volumes in its directory
}

// className is the class a StorageClass's parameters choose.
func className(params map[string]string) string {
	if c := params[ParamDeviceClass]; c != "" {
		return c
	}
	return devclass.Default
}

// get returns the store of the class name, or an error that says why
// this node has none: FailedPrecondition for a class it cannot serve now,
// ResourceExhausted for one it does not have (another node may).
func (c *classes) get(name string) (*store.Store, error) {
	if name == "" || name == devclass.Default {
		return c.def, nil
	}
	if st, ok := c.named[name]; ok {
		return st, nil
	}
	if d, ok := c.down[name]; ok {
		return nil, status.Errorf(codes.FailedPrecondition, "device class %s cannot be served on this node: %v; "+
			"its volumes are kept in %s and out of service until it can", name, d.why, d.path)
	}
	return nil, status.Errorf(codes.ResourceExhausted, "device class %s is not configured on this node (its classes: %v)", name, c.names())
}

// names are the classes served, the default first, then by name.
func (c *classes) names() []string {
	out := []string{devclass.Default}
	return append(out, slices.Sorted(maps.Keys(c.named))...)
}

// of returns the store that holds the volume or snapshot id and its class:
// the default's when none does.
func (c *classes) of(id string) (*store.Store, string) {
	for name, st := range c.named {
		if _, err := st.Volume(id); err == nil {
			return st, name
		}
		if _, err := st.Snapshot(id); err == nil {
			return st, name
		}
	}
	return c.def, devclass.Default
}

// each calls fn with every served class's name and store, in names order.
func (c *classes) each(fn func(name string, st *store.Store)) {
	for _, n := range c.names() {
		st, _ := c.get(n)
		fn(n, st)
	}
}

// forCreate returns the store of the class a new volume's parameters
// choose, refusing a name that another class holds already.
func (c *classes) forCreate(spec store.VolumeSpec) (*store.Store, error) {
	want := className(spec.Params)
	st, err := c.get(want)
	if err != nil {
		return nil, err
	}
	if held, name := c.of(blockdev.VolumeID(spec.Name)); held != st {
		if _, err := held.Volume(blockdev.VolumeID(spec.Name)); err == nil {
			return nil, fmt.Errorf("volume %q exists in device class %s, not %s: %w", spec.Name, name, want, blockdev.ErrConflict)
		}
	}
	return st, nil
}

// The store's calls, routed.

func (c *classes) CreateVolume(ctx context.Context, spec store.VolumeSpec) (blockdev.Volume, error) {
	st, err := c.forCreate(spec)
	if err != nil {
		return blockdev.Volume{}, err
	}
	return st.CreateVolume(ctx, spec)
}

func (c *classes) BeginImport(ctx context.Context, spec store.VolumeSpec) (blockdev.Volume, *store.Import, error) {
	st, err := c.forCreate(spec)
	if err != nil {
		return blockdev.Volume{}, nil, err
	}
	return st.BeginImport(ctx, spec)
}

func (c *classes) Volume(id string) (blockdev.Volume, error) {
	st, _ := c.of(id)
	return st.Volume(id)
}

func (c *classes) Snapshot(id string) (blockdev.Snapshot, error) {
	st, _ := c.of(id)
	return st.Snapshot(id)
}

// Volumes are every class's volumes, in names order, each class's by ID.
func (c *classes) Volumes() []blockdev.Volume {
	var out []blockdev.Volume
	c.each(func(_ string, st *store.Store) { out = append(out, st.Volumes()...) })
	return out
}

// Snapshots are every class's snapshots, in names order.
func (c *classes) Snapshots() []blockdev.Snapshot {
	var out []blockdev.Snapshot
	c.each(func(_ string, st *store.Store) { out = append(out, st.Snapshots()...) })
	return out
}

func (c *classes) Quarantined() []string {
	var out []string
	c.each(func(_ string, st *store.Store) { out = append(out, st.Quarantined()...) })
	return out
}

func (c *classes) VolumeFile(id string) string {
	st, _ := c.of(id)
	return st.VolumeFile(id)
}

func (c *classes) UpdateNode(ctx context.Context, id string, ns blockdev.NodeState) (blockdev.Volume, error) {
	st, _ := c.of(id)
	return st.UpdateNode(ctx, id, ns)
}

func (c *classes) ModifyVolume(ctx context.Context, id string, params map[string]string) (blockdev.Volume, error) {
	st, _ := c.of(id)
	return st.ModifyVolume(ctx, id, params)
}

func (c *classes) ExpandVolume(ctx context.Context, id string, size int64) (blockdev.Volume, error) {
	st, _ := c.of(id)
	return st.ExpandVolume(ctx, id, size)
}

func (c *classes) DeleteVolume(ctx context.Context, id string, detach func(ctx context.Context, volumeID string) error) error {
	st, _ := c.of(id)
	return st.DeleteVolume(ctx, id, detach)
}

func (c *classes) CreateSnapshotTracked(ctx context.Context, name, src string, hold store.Hold, cut *store.ChangeCut) (blockdev.Snapshot, error) {
	st, _ := c.of(src)
	if held, class := c.of(blockdev.SnapshotID(name)); held != st {
		if _, err := held.Snapshot(blockdev.SnapshotID(name)); err == nil {
			return blockdev.Snapshot{}, fmt.Errorf("snapshot %q exists in device class %s: %w", name, class, blockdev.ErrConflict)
		}
	}
	return st.CreateSnapshotTracked(ctx, name, src, hold, cut)
}

func (c *classes) DeleteSnapshot(ctx context.Context, id string) error {
	st, _ := c.of(id)
	return st.DeleteSnapshot(ctx, id)
}

func (c *classes) OpenSnapshot(ctx context.Context, id string) (*os.File, int64, error) {
	st, _ := c.of(id)
	return st.OpenSnapshot(ctx, id)
}

func (c *classes) CopyVolume(ctx context.Context, id string, hold store.Hold) (*os.File, int64, error) {
	st, _ := c.of(id)
	return st.CopyVolume(ctx, id, hold)
}

func (c *classes) Allocated(ctx context.Context, id string) ([]cbt.Extent, int64, error) {
	st, _ := c.of(id)
	return st.Allocated(ctx, id)
}

// Delta of two snapshots of one volume, which share its class; two of
// different classes are not of one volume.
func (c *classes) Delta(ctx context.Context, base, target string, tracked bool) ([]cbt.Extent, int64, store.DeltaMethod, error) {
	st, bc := c.of(base)
	if _, tc := c.of(target); tc != bc {
		if _, err := st.Snapshot(base); err == nil {
			return nil, 0, "", fmt.Errorf("snapshots %s (device class %s) and %s (%s) are not of one volume: %w", base, bc, target, tc, blockdev.ErrInvalid)
		}
	}
	return st.Delta(ctx, base, target, tracked)
}

func (c *classes) BeginTracking(ctx context.Context, id string) ([]cbt.Extent, bool, error) {
	st, _ := c.of(id)
	return st.BeginTracking(ctx, id)
}

func (c *classes) EndTracking(ctx context.Context, id string, exts []cbt.Extent, trusted bool) error {
	st, _ := c.of(id)
	return st.EndTracking(ctx, id, exts, trusted)
}

// AddDeviceClass makes the named class, served from st, one of the node's.
// Call it before serving. The class's name goes into its volumes' CSI IDs
// with this node's tag, so it must fit CSI's 128 bytes beside them.
func (d *Driver) AddDeviceClass(name string, st *store.Store) error {
	if err := d.checkClassName(name); err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("device class %s: no store", name)
	}
	if d.store.named == nil {
		d.store.named = map[string]*store.Store{}
	}
	d.store.named[name] = st
	return nil
}

// AddUnavailableClass records a class this node cannot serve: configured
// with a directory that failed its checks or its store, or removed from
// the configuration while volumes (the store IDs in volumes, found in its
// directory path) use it. Calls for its volumes fail with why
// (FailedPrecondition), status lists them, and the node's other classes
// are served. Call it before serving.
func (d *Driver) AddUnavailableClass(name, path string, volumes []string, why error) error {
	if err := d.checkClassName(name); err != nil {
		return err
	}
	if d.store.down == nil {
		d.store.down = map[string]downClass{}
	}
	d.store.down[name] = downClass{path: path, why: why, volumes: volumes}
	return nil
}

func (d *Driver) checkClassName(name string) error {
	if err := devclass.CheckName(name); err != nil {
		return err
	}
	if name == devclass.Default {
		return fmt.Errorf("device class %q is the data directory's: %w", name, blockdev.ErrInvalid)
	}
	if _, ok := d.store.named[name]; ok {
		return fmt.Errorf("device class %s is configured twice: %w", name, blockdev.ErrInvalid)
	}
	if _, ok := d.store.down[name]; ok {
		return fmt.Errorf("device class %s is configured twice: %w", name, blockdev.ErrInvalid)
	}
	if n := storeIDLen + len(name) + len(d.tag) + 2; n > maxIDLen {
		return fmt.Errorf("device class %s: with node ID %s its volume IDs would be %d bytes, more than CSI's %d: "+
			"use a class name of at most %d characters on this node: %w", name, d.cfg.NodeID, n, maxIDLen, maxIDLen-storeIDLen-2-len(d.tag), blockdev.ErrInvalid)
	}
	return nil
}

// Stores are the stores of the classes served, in names order (for the
// plugin's start-up report of the records they set aside).
func (d *Driver) Stores() []*store.Store {
	var out []*store.Store
	d.store.each(func(_ string, st *store.Store) { out = append(out, st) })
	return out
}

// GroupSnapshot is the group snapshot id in whichever class holds it (a
// group's ID does not name its class): the default class's NotFound when
// none does.
func (c *classes) GroupSnapshot(id string) (blockdev.GroupSnapshot, error) {
	g, err := c.def.GroupSnapshot(id)
	if err == nil {
		return g, nil
	}
	for _, st := range c.named {
		if h, e := st.GroupSnapshot(id); e == nil {
			return h, nil
		}
	}
	return g, err
}

// CreateGroupSnapshot takes a group snapshot in its volumes' class: its
// members' snapshots are made together in one store, so the volumes of a
// group must share a class.
func (c *classes) CreateGroupSnapshot(ctx context.Context, name string, sources []store.GroupSource) (blockdev.GroupSnapshot, error) {
	st, class := c.def, devclass.Default
	for i, s := range sources {
		sst, sc := c.of(s.VolumeID)
		if i > 0 && sst != st {
			return blockdev.GroupSnapshot{}, fmt.Errorf("group snapshot %q: volume %s is in device class %s and volume %s in %s: "+
				"the volumes of a group snapshot share one device class: %w", name, sources[0].VolumeID, class, s.VolumeID, sc, blockdev.ErrInvalid)
		}
		st, class = sst, sc
	}
	return st.CreateGroupSnapshot(ctx, name, sources)
}

// DeleteGroupSnapshot deletes the group snapshot id from the class that
// holds it (none: the default class's answer, gone already).
func (c *classes) DeleteGroupSnapshot(ctx context.Context, id string) error {
	for _, st := range c.named {
		if _, err := st.GroupSnapshot(id); err == nil {
			return st.DeleteGroupSnapshot(ctx, id)
		}
	}
	return c.def.DeleteGroupSnapshot(ctx, id)
}
