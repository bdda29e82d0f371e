package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// storeVolumeID is the store's ID in a CSI ID (the tests' shorthand).
func storeVolumeID(id string) string {
	storeID, _ := splitID(id)
	return storeID
}

// TestClassIDs: a named class's objects carry the class between the
// store's ID and the tag, the default class's keep the shape of IDs made
// before classes, and every shape parses back.
func TestClassIDs(t *testing.T) {
	v := blockdev.VolumeID("pvc-1")
	for _, tc := range []struct {
		id, class, tag, csiID string
	}{
		{v, devclass.Default, "n1", v + "-n1"},
		{v, "", "n1", v + "-n1"},
		{v, "fast-ssd", "n1", v + ".fast-ssd.n1"},
		{v, "nvme", "node.example.com", v + ".nvme.node.example.com"},
		{v, "nvme", "#0a1b2c3d", v + ".nvme.#0a1b2c3d"},
	} {
		got := formatID(tc.id, tc.class, tc.tag)
		if got != tc.csiID {
			t.Errorf("formatID(%s, %q, %s) = %s, want %s", tc.id, tc.class, tc.tag, got, tc.csiID)
		}
		id, class, tag := parseID(got)
		want := tc.class
		if want == "" {
			want = devclass.Default
		}
		if id != tc.id || class != want || tag != tc.tag {
			t.Errorf("parseID(%s) = %s, %s, %s", got, id, class, tag)
		}
	}
	// Not IDs of ours: looked up as they are, never found.
	for _, id := range []string{v, "", "x", v + ".Fast.n1", v + ".fast.", v + ".fast", v + "+n1", "../" + v + "-n1"} {
		if s, class, tag := parseID(id); s != id || class != devclass.Default || tag != "" {
			t.Errorf("parseID(%q) = %q, %q, %q; want it whole, untagged", id, s, class, tag)
		}
	}
}

// classNode is a test node with the default class and two named ones,
// fast and bulk, each in a directory of its own (bulk with a 1 GiB
// reserve), all three on the test's one filesystem.
type classNode struct {
	*testNode
	fast, bulk string // their directories
	reported   *reports
}

// reports records what the driver tells its NoCapacityReporter.
type reports struct {
	mu   sync.Mutex
	whys []string
}

func (r *reports) NoCapacity(_ map[string]string, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.whys = append(r.whys, why)
}

func (r *reports) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.whys) == 0 {
		return ""
	}
	return r.whys[len(r.whys)-1]
}

func newClassNode(t *testing.T, dir string) *classNode {
	t.Helper()
	fast, bulk := filepath.Join(dir, "fast"), filepath.Join(dir, "bulk")
	for _, d := range []string{fast, bulk} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	def, err := store.Open(store.Config{Dir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { def.Close() })
	b, err := backend.New("loop", backend.Config{DataDir: filepath.Join(dir, "data"), ClassDirs: []string{fast, bulk}, DevDir: filepath.Join(dir, "dev")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	rep := &reports{}
	d, err := New(Config{Name: "fastblk.csi.io", NodeID: "n1", NoCapacity: rep}, def, b)
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]store.Config{"fast": {Dir: fast}, "bulk": {Dir: bulk, ReserveBytes: 1 << 30}} {
		st, err := store.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := d.AddDeviceClass(name, st); err != nil {
			t.Fatal(err)
		}
	}
	return &classNode{testNode: &testNode{t: t, dir: dir, d: d, ctrl: &Controller{d: d}, node: &Node{d: d}, backend: b},
		fast: fast, bulk: bulk, reported: rep}
}

// createIn creates the volume name of size bytes in class (params adds
// to the class), from src.
func (n *classNode) createIn(class, name string, size int64, src *csi.VolumeContentSource) (string, error) {
	params := map[string]string{}
	if class != "" {
		params[ParamDeviceClass] = class
	}
	resp, err := n.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)},
		VolumeContentSource: src})
	return resp.GetVolume().GetVolumeId(), err
}

func (n *classNode) capacity(class string) int64 {
	n.t.Helper()
	params := map[string]string{}
	if class != "" {
		params[ParamDeviceClass] = class
	}
	resp, err := n.ctrl.GetCapacity(context.Background(), &csi.GetCapacityRequest{Parameters: params, AccessibleTopology: n.d.topology()})
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.GetAvailableCapacity()
}

// TestVolumesLandInTheirClass: a StorageClass's deviceClass picks the
// store, the volume's ID names it, and every later call finds it there
// (also after a restart); a name lives in one class only, and bad class
// parameters are refused clearly.
func TestVolumesLandInTheirClass(t *testing.T) {
	dir := t.TempDir()
	n := newClassNode(t, dir)
	ctx := context.Background()
	fastVol, err := n.createIn("fast", "pvc-fast", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defVol, err := n.createIn("", "pvc-default", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fastVol, ".fast.n1") || strings.Contains(defVol, ".") {
		t.Errorf("IDs %s and %s: want the class in the first only", fastVol, defVol)
	}
	if _, err := os.Stat(filepath.Join(n.fast, "volumes", storeVolumeID(fastVol)+".img")); err != nil {
		t.Errorf("the fast volume is not in fast's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "volumes", storeVolumeID(defVol)+".img")); err != nil {
		t.Errorf("the default volume is not in the data directory: %v", err)
	}
	if again, err := n.createIn("fast", "pvc-fast", 8<<20, nil); err != nil || again != fastVol {
		t.Errorf("CreateVolume again: %s, %v; want %s", again, err, fastVol)
	}
	_, err = n.createIn("bulk", "pvc-fast", 8<<20, nil)
	wantCode(t, "the same name in another class", err, codes.AlreadyExists, "exists in device class fast")
	_, err = n.createIn("nope", "pvc-nope", 8<<20, nil)
	wantCode(t, "an unknown class", err, codes.ResourceExhausted, "device class nope is not configured on this node (its classes: [default bulk fast])")
	_, err = n.createIn("Fast", "pvc-bad", 8<<20, nil)
	wantCode(t, "a bad class name", err, codes.InvalidArgument, "deviceClass")

	got, err := n.ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: fastVol})
	if err != nil || got.GetVolume().GetVolumeId() != fastVol {
		t.Errorf("ControllerGetVolume(%s) = %v, %v", fastVol, got.GetVolume(), err)
	}
	list, err := n.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range list.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = true
	}
	if !listed[fastVol] || !listed[defVol] || len(listed) != 2 {
		t.Errorf("ListVolumes = %v, want %s and %s", listed, fastVol, defVol)
	}
	if _, err := n.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: fastVol,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}}); err != nil {
		t.Errorf("expand in its class: %v", err)
	}
	st, err := n.d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	classOf := map[string]string{}
	for _, v := range st.Volumes {
		classOf[v.Name] = v.Class
	}
	if classOf["pvc-fast"] != "fast" || classOf["pvc-default"] != devclass.Default {
		t.Errorf("status classes %v", classOf)
	}
	if _, err := n.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: fastVol}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(n.fast, "volumes", storeVolumeID(fastVol)+".img")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted volume's file: %v", err)
	}
}

// TestClassFoundAfterRestart: a restarted plugin (new stores over the same
// directories) finds a class's volume from its ID and stages it on the
// loop backend from the class's directory.
func TestClassFoundAfterRestart(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	n := newClassNode(t, dir)
	id, err := n.createIn("bulk", "pvc-bulk", 32<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range n.d.Stores() {
		st.Close()
	}
	n2 := newClassNode(t, dir)
	target := n2.stage(id, mountCap("ext4", snw), false)
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("bulk"), 0o600); err != nil {
		t.Fatal(err)
	}
	devs, err := n2.backend.List(context.Background())
	if err != nil || len(devs) != 1 || devs[0].VolumeID != storeVolumeID(id) {
		t.Fatalf("the loop backend lists %+v, %v; want the bulk volume's device", devs, err)
	}
}

// TestCapacityPerDeviceClass: GetCapacity answers for the StorageClass's device
// class: a class's volumes take its capacity and not another's, and a
// class the node lacks gets none, with the reason told.
func TestCapacityPerDeviceClass(t *testing.T) {
	n := newClassNode(t, t.TempDir())
	// The machine's other work changes the filesystem's free space
	// between two looks: compare within slack.
	const slack = 256 << 20
	near := func(a, b int64) bool { return a-b < slack && b-a < slack }
	fast, bulk, def := n.capacity("fast"), n.capacity("bulk"), n.capacity("")
	if fast <= 2<<30 || !near(bulk, fast-1<<30) || !near(def, fast) {
		t.Fatalf("capacities fast %d, bulk %d (1 GiB reserved), default %d: want them equal but bulk's reserve (one filesystem)", fast, bulk, def)
	}
	// Filling fast (sparse, not over-provisioned: its whole size is
	// promised) leaves bulk's capacity as it was.
	size := (fast - 1<<30) &^ (4<<10 - 1)
	if _, err := n.createIn("fast", "pvc-big", size, nil); err != nil {
		t.Fatal(err)
	}
	if got := n.capacity("fast"); !near(got, fast-size) {
		t.Errorf("fast after a %d-byte volume: %d, want about %d", size, got, fast-size)
	}
	if got := n.capacity("bulk"); !near(got, bulk) {
		t.Errorf("bulk after fast was filled: %d, want about %d still", got, bulk)
	}
	if got := n.capacity("nope"); got != 0 || !strings.Contains(n.reported.last(), "device class nope is not configured") {
		t.Errorf("an unknown class: capacity %d, reported %q", got, n.reported.last())
	}
	if got := n.capacity("Bad"); got != 0 || !strings.Contains(n.reported.last(), "device class name \"Bad\"") {
		t.Errorf("a bad class name: capacity %d, reported %q", got, n.reported.last())
	}
}

// TestCopiesStayInTheirClass: snapshots, restores and clones of a class's
// volume are made in that class; into another class they are refused,
// saying which class to use.
func TestCopiesStayInTheirClass(t *testing.T) {
	n := newClassNode(t, t.TempDir())
	ctx := context.Background()
	vol, err := n.createIn("fast", "pvc-src", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := n.snapshot("snap-src", vol)
	if !strings.Contains(snap, ".fast.n1") {
		t.Errorf("snapshot ID %s lacks its class", snap)
	}
	if _, err := os.Stat(filepath.Join(n.fast, "snapshots", storeVolumeID(snap)+".img")); err != nil {
		t.Errorf("the snapshot is not in fast's directory: %v", err)
	}
	list, err := n.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: vol})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != vol {
		t.Errorf("ListSnapshots by source %s = %v, %v", vol, list.GetEntries(), err)
	}
	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
	fromVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}}
	for _, src := range []*csi.VolumeContentSource{fromSnap, fromVol} {
		_, err := n.createIn("bulk", "pvc-elsewhere", 8<<20, src)
		wantCode(t, "into bulk", err, codes.InvalidArgument, `use a StorageClass with deviceClass: "fast"`)
		_, err = n.createIn("", "pvc-elsewhere", 8<<20, src)
		wantCode(t, "into the default class", err, codes.InvalidArgument, "device class fast")
	}
	restored, err := n.createIn("fast", "pvc-restored", 8<<20, fromSnap)
	if err != nil {
		t.Fatal(err)
	}
	cloned, err := n.createIn("fast", "pvc-cloned", 8<<20, fromVol)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{restored, cloned} {
		if _, err := os.Stat(filepath.Join(n.fast, "volumes", storeVolumeID(id)+".img")); err != nil {
			t.Errorf("%s is not in fast's directory: %v", id, err)
		}
	}
	if _, err := n.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap}); err != nil {
		t.Fatal(err)
	}
}

// TestUnavailableClass: a class the node cannot serve (its directory
// failed its checks, or it was removed while volumes use it) refuses its
// volumes' calls with why, never answering as if they were gone (a
// DeleteVolume that succeeded would drop a PV whose data stays); status
// names the class and its volumes; the other classes are served.
func TestUnavailableClass(t *testing.T) {
	n := newClassNode(t, t.TempDir())
	ctx := context.Background()
	stranded := blockdev.VolumeID("pvc-old")
	why := errors.New("removed from the configuration while 1 of its volumes are in /mnt/old")
	if err := n.d.AddUnavailableClass("old", "/mnt/old", []string{stranded}, why); err != nil {
		t.Fatal(err)
	}
	id := formatID(stranded, "old", "n1")
	_, err := n.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "DeleteVolume", err, codes.FailedPrecondition, "device class old cannot be served on this node: "+why.Error())
	_, err = n.ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
	wantCode(t, "ControllerGetVolume", err, codes.FailedPrecondition, "kept in /mnt/old")
	_, err = n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging", VolumeCapability: mountCap("", snw)})
	wantCode(t, "NodeStageVolume", err, codes.FailedPrecondition, "device class old")
	_, err = n.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: "/target"})
	wantCode(t, "NodeUnpublishVolume", err, codes.FailedPrecondition, "device class old")
	_, err = n.createIn("old", "pvc-new", 8<<20, nil)
	wantCode(t, "CreateVolume in it", err, codes.FailedPrecondition, "device class old")
	if got := n.capacity("old"); got != 0 || !strings.Contains(n.reported.last(), "device class old cannot be served") {
		t.Errorf("its capacity %d, reported %q", got, n.reported.last())
	}
	if _, err := n.createIn("fast", "pvc-fast", 8<<20, nil); err != nil {
		t.Errorf("another class is not served: %v", err)
	}
	st, err := n.d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range st.Classes {
		names = append(names, c.Name)
		if c.Name == "old" && (!c.Unavailable || c.Error != why.Error() || len(c.Stranded) != 1 || c.Stranded[0] != id) {
			t.Errorf("status of old: %+v", c)
		}
	}
	if strings.Join(names, ",") != "default,bulk,fast,old" {
		t.Errorf("status classes %v, want default, bulk, fast, old", names)
	}
	health, err := n.node.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range health.GetBackendHealth() {
		found = found || (h.GetReason() == reasonClassDown && strings.Contains(h.GetMessage(), "device class old"))
	}
	if !found {
		t.Errorf("storage health does not name the class: %v", health.GetBackendHealth())
	}
}

// TestClassNameFitsTheNodesIDs: a class whose name would make its volume
// IDs longer than CSI's 128 bytes with this node's tag is refused, saying
// how long a name may be.
func TestClassNameFitsTheNodesIDs(t *testing.T) {
	dir := t.TempDir()
	def, err := store.Open(store.Config{Dir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	node := strings.Repeat("n", 90)
	d, err := New(Config{Name: "fastblk.csi.io", NodeID: node}, def, nopBackend{})
	if err != nil {
		t.Fatal(err)
	}
	err = d.AddDeviceClass("abcd", def)
	if !errors.Is(err, blockdev.ErrInvalid) || !strings.Contains(err.Error(), "at most 3 characters") {
		t.Errorf("a 4-character class on a node of 90: %v", err)
	}
	if err := d.AddDeviceClass("abc", def); err != nil {
		t.Errorf("a 3-character class: %v", err)
	}
	if id := d.publicIDIn(blockdev.VolumeID("x"), "abc"); len(id) != maxIDLen {
		t.Errorf("ID %s is %d bytes, want %d", id, len(id), maxIDLen)
	}
	for _, bad := range []string{devclass.Default, "abc", "Bad"} {
		if err := d.AddDeviceClass(bad, def); err == nil {
			t.Errorf("AddDeviceClass(%q) accepted", bad)
		}
	}
}

// nopBackend is a Backend for tests that attach nothing.
type nopBackend struct{}

func (nopBackend) Name() string { return "nop" }
func (nopBackend) Attach(context.Context, blockdev.AttachRequest) (blockdev.Device, error) {
	return blockdev.Device{}, blockdev.ErrNotSupported
}
func (nopBackend) Detach(context.Context, string) error            { return nil }
func (nopBackend) Resize(context.Context, string, int64) error     { return blockdev.ErrNotSupported }
func (nopBackend) List(context.Context) ([]blockdev.Device, error) { return nil, nil }
func (nopBackend) Close() error                                    { return nil }

// TestPullStaysInItsClass: a restore on n2 of n1's snapshot of a class's
// volume pulls the data into n2's store of that class, and its ID names
// the class; into another class it is refused before anything is pulled.
func TestPullStaysInItsClass(t *testing.T) {
	requireRoot(t)
	n1, n2, srv := peerNodesWith(t, "loop")
	srv.stop() // n1's classes are set before it serves again
	fast := map[*testNode]string{}
	for _, n := range []*testNode{n1, n2} {
		fast[n] = filepath.Join(n.dir, "fast")
		if err := os.Mkdir(fast[n], 0o700); err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(store.Config{Dir: fast[n]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := n.d.AddDeviceClass("fast", st); err != nil {
			t.Fatal(err)
		}
	}
	srv.start()
	inFast := map[string]string{ParamDeviceClass: "fast"}
	vol, err := n1.createFrom("pvc-src", 16<<20, nil, inFast, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n1.writeExtents(vol.GetVolumeId(), [][2]int64{{1 << 20, 1 << 20}})
	snap := n1.snapshot("snap-src", vol.GetVolumeId())
	if _, err := n2.createFrom("pvc-default", 16<<20, snapshotSource(snap), nil, time.Minute); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "device class fast") {
		t.Errorf("a restore on n2 into the default class: %v, want InvalidArgument naming fast", err)
	}
	v, err := n2.createPulled("pvc-restore", 16<<20, snapshotSource(snap), inFast, time.Minute)
	if err != nil {
		t.Fatalf("a restore on n2 into fast: %v", err)
	}
	if !strings.HasSuffix(v.GetVolumeId(), ".fast.n2") || v.GetContentSource().GetSnapshot().GetSnapshotId() != snap {
		t.Errorf("restored volume %v: want an ID of fast on n2 and its source %s", v, snap)
	}
	restored := filepath.Join(fast[n2], "volumes", storeVolumeID(v.GetVolumeId())+".img")
	if fileSum(t, restored) != fileSum(t, n1.file(snap)) {
		t.Error("the restored volume in n2's fast class differs from the snapshot")
	}
}

// TestGroupSnapshotStaysInOneClass: a group snapshot of a class's volumes
// is taken in that class (its members name it and are found by their
// IDs), Get and Delete find the group there, and a group of volumes of
// two classes is refused, saying so.
func TestGroupSnapshotStaysInOneClass(t *testing.T) {
	n := newClassNode(t, t.TempDir())
	ctx := context.Background()
	g := &GroupController{d: n.d}
	var fast []string
	for _, name := range []string{"pvc-a", "pvc-b"} {
		id, err := n.createIn("fast", name, 8<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		fast = append(fast, id)
	}
	resp, err := g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-fast", SourceVolumeIds: fast})
	if err != nil {
		t.Fatal(err)
	}
	grp := resp.GetGroupSnapshot()
	if len(grp.GetSnapshots()) != 2 || !grp.GetReadyToUse() {
		t.Fatalf("group %v: want two members, ready", grp)
	}
	for _, s := range grp.GetSnapshots() {
		if !strings.Contains(s.GetSnapshotId(), ".fast.") {
			t.Errorf("member %s does not name its class fast", s.GetSnapshotId())
		}
	}
	if got, err := g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId()}); err != nil ||
		len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("GetVolumeGroupSnapshot: %v, %v", got, err)
	}

	def, err := n.createIn("", "pvc-default", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-mixed", SourceVolumeIds: []string{fast[0], def}})
	wantCode(t, "a group of two classes' volumes", err, codes.InvalidArgument, "share one device class")

	if _, err := g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: grp.GetGroupSnapshotId()}); status.Code(err) != codes.NotFound {
		t.Errorf("GetVolumeGroupSnapshot after delete: %v, want NotFound", err)
	}
}
