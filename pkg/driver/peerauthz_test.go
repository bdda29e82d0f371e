package driver

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	storagev1beta1 "k8s.io/api/storage/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fastblk/csi-fastblk/pkg/peer"
	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

// authzNodes are peerNodes whose n1 authorizes n2's calls by the objects
// of api.
func authzNodes(t *testing.T) (n1, n2 *testNode, api *peertest.API) {
	t.Helper()
	n1, n2, _ = peerNodesWith(t, "loop")
	api = peertest.New()
	n1.d.cfg.PeerAuthz = &APIAuthorizer{API: api.Client, Driver: n1.d.cfg.Name}
	return n1, n2, api
}

// claim is the PVC shop/name.
func claim(name, uid, selectedNode string, source *corev1.TypedLocalObjectReference, volumeName, class, storage string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid), Annotations: map[string]string{annSelectedNode: selectedNode}},
		Spec: corev1.PersistentVolumeClaimSpec{DataSource: source, VolumeName: volumeName,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(storage)}}},
	}
	if class != "" {
		c.Spec.VolumeAttributesClassName = &class
	}
	if volumeName != "" {
		c.Status.Phase = corev1.ClaimBound
	}
	return c
}

func fromSnapshot(name string) *corev1.TypedLocalObjectReference {
	group := "snapshot.storage.k8s.io"
	return &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: name}
}

// snapshotObjects puts in api the VolumeSnapshot shop/name bound to a
// pre-provisioned content of driver whose handle is handle.
func snapshotObjects(t *testing.T, api *peertest.API, driver, name, handle string) {
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": "shop", "name": name, "uid": "u-" + name},
		"status":   map[string]any{"boundVolumeSnapshotContentName": "content-" + name}}})
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": "content-" + name},
		"spec": map[string]any{"driver": driver, "source": map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"namespace": "shop", "name": name, "uid": "u-" + name}},
		"status": map[string]any{"snapshotHandle": handle}}})
}

// pvOf is the PV name of the CSI volume id on driver, bound to shop/claim.
func pvOf(name, driver, id, claim, uid string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: id}},
		ClaimRef:               &corev1.ObjectReference{Namespace: "shop", Name: claim, UID: types.UID(uid)}},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
}

// TestPeerReadNeedsClaimOfCaller: n2 may read n1's snapshot or volume
// only for a claim scheduled to n2, not bound yet, whose data source is
// that snapshot or volume; asking for one that no claim of n2 uses is PermissionDenied
// naming what is missing, before anything is opened. A restore on n2 of a
// claim that asks for it pulls the data.
func TestPeerReadNeedsClaimOfCaller(t *testing.T) {
	requireRoot(t)
	n1, n2, api := authzNodes(t)
	drv := n1.d.cfg.Name
	vol, snap := n1.source(8<<20, [][2]int64{{0, 1 << 20}})
	other := n1.snapshot("snap-weekly", n1.create("pvc-weekly", 8<<20, nil))
	snapshotObjects(t, api, drv, "nightly", snap)
	snapshotObjects(t, api, drv, "weekly", other)
	api.Put(t, claim("restore", "u1", "n2", fromSnapshot("nightly"), "", "", "8Mi"))
	api.Put(t, claim("on-n1", "u2", "n1", fromSnapshot("nightly"), "", "", "8Mi"))
	api.Put(t, claim("weekly", "u3", "n2", fromSnapshot("weekly"), "", "", "8Mi"))
	api.Put(t, claim("lost", "u4", "n2", fromSnapshot("gone"), "", "", "8Mi"))
	api.Put(t, claim("empty", "u5", "n2", nil, "", "", "8Mi"))
	api.Put(t, claim("bound", "u8", "n2", fromSnapshot("nightly"), "pvc-u8", "", "8Mi"))
	api.Put(t, claim("clone", "u6", "n2", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}, "", "", "8Mi"))
	api.Put(t, claim("src", "u7", "n1", nil, "pvc-src", "", "8Mi"))
	api.Put(t, pvOf("pvc-src", drv, vol, "src", "u7"))

	read := func(kind peer.SourceKind, id, claim string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := n2.d.cfg.Peers.ReadData(ctx, NodeTag("n1"), &peer.ReadRequest{Kind: kind, ID: id, Target: "pvc-x", Claim: claim}, discard{}, time.Minute)
		return err
	}
	for _, tc := range []struct {
		name, claim string
		kind        peer.SourceKind
		id, says    string
	}{
		{"no claim named", "", peer.SourceSnapshot, snap, "names no claim"},
		{"no such claim", "shop/ghost", peer.SourceSnapshot, snap, "claim shop/ghost does not exist"},
		{"a claim of n1", "shop/on-n1", peer.SourceSnapshot, snap, "claim shop/on-n1 is not scheduled to node n2"},
		{"a claim of another snapshot", "shop/weekly", peer.SourceSnapshot, snap, "VolumeSnapshot shop/weekly is not the snapshot " + snap},
		{"a claim whose snapshot is gone", "shop/lost", peer.SourceSnapshot, snap, "VolumeSnapshot shop/gone does not exist"},
		{"a claim without a source", "shop/empty", peer.SourceSnapshot, snap, "claim shop/empty has no data source"},
		{"a claim bound already", "shop/bound", peer.SourceSnapshot, snap, "claim shop/bound is bound already"},
		{"a snapshot's claim for a volume", "shop/restore", peer.SourceVolume, vol, "not a PersistentVolumeClaim"},
		{"a clone's claim for a snapshot", "shop/clone", peer.SourceSnapshot, snap, "not a VolumeSnapshot"},
		{"a clone's claim for another volume", "shop/clone", peer.SourceVolume, n1.create("pvc-other", 1<<20, nil), "is not bound to the volume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := read(tc.kind, tc.id, tc.claim)
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("read: %v; want PermissionDenied saying %q", err, tc.says)
			}
		})
	}
	if err := read(peer.SourceSnapshot, snap, "shop/restore"); err != nil {
		t.Errorf("read of the snapshot for the claim that restores it on n2: %v", err)
	}
	if err := read(peer.SourceVolume, vol, "shop/clone"); err != nil {
		t.Errorf("read of the volume for the claim that clones it on n2: %v", err)
	}
	// The provisioner's CreateVolume on n2 names the claim, and the
	// pull sends it.
	params := map[string]string{ParamPVCNamespace: "shop", ParamPVCName: "restore"}
	if _, err := n2.createPulled("pvc-u1", 8<<20, snapshotSource(snap), params, time.Minute); err != nil {
		t.Errorf("restore on n2 for its claim: %v", err)
	}
	params[ParamPVCName] = "on-n1"
	if _, err := n2.createPulled("pvc-u2", 8<<20, snapshotSource(snap), params, time.Minute); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("restore on n2 for a claim of n1: %v; want ResourceExhausted (the claim goes to the source's node)", err)
	}
}

// TestPeerHandoffNeedsClaimOfCaller: n1 makes a volume from its snapshot
// for n2 only for a claim of n2 restoring that snapshot.
func TestPeerHandoffNeedsClaimOfCaller(t *testing.T) {
	requireRoot(t)
	_, n2, api, snap := handoffSetup(t)
	api.Put(t, restoreClaim("restore", "u1", "handoff", "8Mi"))
	params := map[string]string{ParamCrossNodeSource: "handoff", ParamPVCNamespace: "shop", ParamPVCName: "other"}
	if _, err := n2.createFrom("pvc-other", 8<<20, snapshotSource(snap), params, time.Minute); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "claim shop/other does not exist") {
		t.Errorf("handoff for a claim that does not exist: %v; want PermissionDenied naming it", err)
	}
	params[ParamPVCName] = "restore"
	if v, err := n2.createFrom("pvc-u1", 8<<20, snapshotSource(snap), params, time.Minute); err != nil || !strings.HasSuffix(v.GetVolumeId(), "-n1") {
		t.Errorf("handoff for n2's claim: %v, %v; want n1's volume", v, err)
	}
}

// classedVolume is a volume of n1 whose PV pvc-u1 is bound to the claim
// shop/data, which asks for class and 4Mi.
func classedVolume(t *testing.T, n1 *testNode, api *peertest.API, class string) string {
	t.Helper()
	vol := n1.create("pvc-u1", 1<<20, nil)
	api.Put(t, pvOf("pvc-u1", n1.d.cfg.Name, vol, "data", "u1"))
	api.Put(t, claim("data", "u1", "n1", nil, "pvc-u1", class, "4Mi"))
	return vol
}

// modifyFrom is n2's ControllerModifyVolume of vol, which it forwards.
func modifyFrom(n2 *testNode, vol string) func(params map[string]string) error {
	return func(params map[string]string) error {
		_, err := n2.ctrl.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: params})
		return err
	}
}

// TestPeerModifyNeedsClaimAsking: a forwarded ControllerModifyVolume or
// ControllerExpandVolume of n1's volume is served only as the volume's PV
// and claim ask: the class the claim names, with exactly the call's
// parameters, and a size up to the claim's request.
func TestPeerModifyNeedsClaimAsking(t *testing.T) {
	requireRoot(t)
	n1, n2, api := authzNodes(t)
	drv := n1.d.cfg.Name
	vol := classedVolume(t, n1, api, "gold")
	api.Put(t, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, DriverName: drv, Parameters: map[string]string{ParamMaxIOPS: "0"}})
	ctx := context.Background()
	modify := modifyFrom(n2, vol)
	expand := func(size int64) error {
		_, err := n2.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
		return err
	}
	denied := func(what string, err error, says string) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v; want PermissionDenied saying %q", what, err, says)
		}
	}
	if err := modify(map[string]string{ParamMaxIOPS: "0"}); err != nil {
		t.Errorf("modify as the claim's class asks: %v", err)
	}
	denied("modify to other parameters", modify(map[string]string{ParamMaxIOPS: "1000"}), "claim shop/data asks for VolumeAttributesClass gold")
	if err := expand(4 << 20); err != nil {
		t.Errorf("expand to the claim's size: %v", err)
	}
	denied("expand past the claim's size", expand(8<<20), "claim shop/data asks for 4Mi")

	api.Put(t, claim("data", "u1", "n1", nil, "pvc-u1", "", "4Mi"))
	denied("modify of a claim without a class", modify(map[string]string{ParamMaxIOPS: "0"}), "claim shop/data asks for no VolumeAttributesClass")
	api.Put(t, claim("data", "u-new", "n1", nil, "pvc-u1", "gold", "8Mi"))
	denied("expand for a claim of the same name made anew", expand(8<<20), "is not bound to persistent volume pvc-u1")
	api.Remove(t, pvOf("pvc-u1", drv, vol, "data", "u1"))
	denied("modify without a PV", modify(map[string]string{ParamMaxIOPS: "0"}), "persistent volume pvc-u1 of volume "+vol+" does not exist")
	if v, _ := n1.d.store.Volume(storeVolumeID(vol)); v.SizeBytes != 4<<20 {
		t.Errorf("n1's volume is %d bytes after the refusals, want 4 MiB", v.SizeBytes)
	}
}

// discard is a Sink that keeps nothing.
type discard struct{}

func (discard) Start(int64, int64) (io.WriterAt, error) { return discard{}, nil }
func (discard) WriteAt(p []byte, _ int64) (int, error)  { return len(p), nil }
func (discard) Progress(int64)                          {}

// TestPeerModifyReadsBetaClass: on a cluster that serves the claim's
// VolumeAttributesClass only as v1beta1, a forwarded modify is authorized
// by it all the same, and refused when its parameters differ.
func TestPeerModifyReadsBetaClass(t *testing.T) {
	requireRoot(t)
	n1, n2, api := authzNodes(t)
	vol := classedVolume(t, n1, api, "silver")
	api.Put(t, &storagev1beta1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "silver"}, DriverName: n1.d.cfg.Name, Parameters: map[string]string{ParamMaxIOPS: "0"}})
	modify := modifyFrom(n2, vol)
	if err := modify(map[string]string{ParamMaxIOPS: "0"}); err != nil {
		t.Errorf("modify as the claim's beta class asks: %v", err)
	}
	if err := modify(map[string]string{ParamMaxIOPS: "1000"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("modify to other parameters: %v, want PermissionDenied", err)
	}
}
