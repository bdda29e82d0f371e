package driver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer"
	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

// The objects of these tests: a tenant "bank" whose claim ledger is bound
// to a volume of n1, and a tenant "shop" who may create claims and
// snapshots in its own namespace, with a stolen n2 that may write what a
// node's account may (issue 53, findings 1 and 2).
const forgeDriver = "fastblk.csi.io"

// boundClaim is the claim ns/name (uid) bound to the PV pv, and that PV,
// of the CSI volume id, bound back to the claim: as the PV controller
// leaves them.
func boundClaimAndPV(ns, name, uid, pv, id string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: pv},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: forgeDriver, VolumeHandle: id}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name, UID: types.UID(uid)},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	return c, v
}

// pendingClaim is the claim ns/name scheduled to node, not bound, whose
// data source is source.
func pendingClaim(ns, name, uid, node string, source *corev1.TypedLocalObjectReference) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: map[string]string{annSelectedNode: node}},
		Spec:       corev1.PersistentVolumeClaimSpec{DataSource: source},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

func fromClaim(name string) *corev1.TypedLocalObjectReference {
	return &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: name}
}

// tagged is the CSI ID of the store ID id on node.
func tagged(id, node string) string { return id + "-" + NodeTag(node) }

// dynamicSnapshot puts in api the VolumeSnapshot ns/name (uid) of the
// volume volumeID and the content the snapshot controller made for it,
// whose status the csi-snapshotter filled with handle; it returns the
// handle the csi-snapshotter's CreateSnapshot got from this plugin.
func dynamicSnapshot(t *testing.T, api *peertest.API, ns, name, uid, volumeID, handle string) string {
	t.Helper()
	content := "snapcontent-" + uid
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": uid},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": "x"}},
		"status":   map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": true}}})
	_, volNode := splitID(volumeID)
	// The csi-snapshotter's name (its default --snapshot-name-prefix).
	made := blockdev.SnapshotID("snapshot-"+uid) + "-" + volNode
	if handle == "" {
		handle = made
	}
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content},
		"spec": map[string]any{"driver": forgeDriver, "deletionPolicy": "Delete",
			"source":            map[string]any{"volumeHandle": volumeID},
			"volumeSnapshotRef": map[string]any{"kind": "VolumeSnapshot", "namespace": ns, "name": name, "uid": uid}},
		"status": map[string]any{"snapshotHandle": handle, "readyToUse": true}}})
	return made
}

// readAs asks az whether node may read source of kind for claim, and
// checks the answer: allowed, or PermissionDenied saying says.
func readAs(t *testing.T, az *APIAuthorizer, node, claim string, kind peer.SourceKind, source, says string) {
	t.Helper()
	err := az.Read(context.Background(), node, claim, kind, source)
	switch {
	case says == "" && err != nil:
		t.Errorf("read of %s %s for %s as %s: %v; want it allowed", kind, source, claim, node, err)
	case says != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), says)):
		t.Errorf("read of %s %s for %s as %s: %v; want PermissionDenied saying %q", kind, source, claim, node, err, says)
	}
}

// TestPeerReadCloneNeedsBoundSource is finding 1: a tenant's claim
// pre-bound to another namespace's PV (spec.volumeName, which anyone who
// may create claims may set, and which stays Pending) is no source of a
// clone. A clone's source is read only when the source claim is Bound and
// its PV's claimRef (namespace, name and uid) names that claim, as the
// external-provisioner checks before it clones.
func TestPeerReadCloneNeedsBoundSource(t *testing.T) {
	api := peertest.New()
	az := &APIAuthorizer{API: api.Client, Driver: forgeDriver}
	bankVol := tagged(blockdev.VolumeID("pvc-u-ledger"), "n1")
	ledger, ledgerPV := boundClaimAndPV("bank", "ledger", "u-ledger", "pvc-u-ledger", bankVol)
	api.Put(t, ledger)
	api.Put(t, ledgerPV)
	// shop's claim src names bank's PV; Kubernetes accepts it, Pending.
	src := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "src", UID: "u-src"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-u-ledger"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	api.Put(t, src)
	api.Put(t, pendingClaim("shop", "dst", "u-dst", "n2", fromClaim("src")))
	readAs(t, az, "n2", "shop/dst", peer.SourceVolume, bankVol, "claim shop/src (the data source of claim shop/dst) is not bound")

	// Its status set Bound as well (the node account may patch claims'
	// status): bank's PV still names bank's claim.
	src.Status.Phase = corev1.ClaimBound
	api.Put(t, src)
	readAs(t, az, "n2", "shop/dst", peer.SourceVolume, bankVol, "persistent volume pvc-u-ledger is bound to claim bank/ledger (uid u-ledger), not to claim shop/src (uid u-src)")

	// A claim of the same name made anew after the PV was bound.
	api.Put(t, pendingClaim("bank", "dst", "u-bdst", "n2", fromClaim("ledger")))
	ledger.UID = "u-ledger-2"
	api.Put(t, ledger)
	readAs(t, az, "n2", "bank/dst", peer.SourceVolume, bankVol, "not to claim bank/ledger (uid u-ledger-2)")
	ledger.UID = "u-ledger"
	api.Put(t, ledger)

	// bank's own clone of its claim is read.
	readAs(t, az, "n2", "bank/dst", peer.SourceVolume, bankVol, "")
}

// TestPeerReadRestoreTakesHandleFromSpec is finding 2: a snapshot's
// handle is taken from what no node writes, never from the content's
// status (the node account may patch volumesnapshotcontents/status): the
// content's spec.source.snapshotHandle for a pre-provisioned content, or,
// for one the snapshot controller made, the snapshot the csi-snapshotter
// names after spec.volumeSnapshotRef's uid from the volume in
// spec.source.volumeHandle; and that spec.volumeSnapshotRef must point
// back to the snapshot, uid and all.
func TestPeerReadRestoreTakesHandleFromSpec(t *testing.T) {
	api := peertest.New()
	az := &APIAuthorizer{API: api.Client, Driver: forgeDriver}
	bankVol := tagged(blockdev.VolumeID("pvc-u-ledger"), "n1")
	bankSnap := dynamicSnapshot(t, api, "bank", "nightly", "u-nightly", bankVol, "")
	shopVol := tagged(blockdev.VolumeID("pvc-u-cart"), "n2")

	// shop's own snapshot, whose content's status n2 rewrote to bank's
	// snapshot.
	dynamicSnapshot(t, api, "shop", "mine", "u-mine", shopVol, bankSnap)
	api.Put(t, pendingClaim("shop", "r", "u-r", "n2", fromSnapshot("mine")))
	readAs(t, az, "n2", "shop/r", peer.SourceSnapshot, bankSnap, "VolumeSnapshot shop/mine is not the snapshot "+bankSnap)

	// shop's snapshot bound (its status) to bank's content: the content
	// points back to bank's snapshot.
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": "shop", "name": "theirs", "uid": "u-theirs"},
		"status":   map[string]any{"boundVolumeSnapshotContentName": "snapcontent-u-nightly"}}})
	api.Put(t, pendingClaim("shop", "r2", "u-r2", "n2", fromSnapshot("theirs")))
	readAs(t, az, "n2", "shop/r2", peer.SourceSnapshot, bankSnap,
		"VolumeSnapshotContent snapcontent-u-nightly of VolumeSnapshot shop/theirs is the content of VolumeSnapshot bank/nightly (uid u-nightly)")

	// A pre-provisioned content: its spec's handle counts, whatever its
	// status says.
	preSnap := tagged(blockdev.SnapshotID("imported"), "n1")
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": "shop", "name": "pre", "uid": "u-pre"},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": "shop-pre"}},
		"status":   map[string]any{"boundVolumeSnapshotContentName": "shop-pre"}}})
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": "shop-pre"},
		"spec": map[string]any{"driver": forgeDriver, "deletionPolicy": "Retain",
			"source":            map[string]any{"snapshotHandle": preSnap},
			"volumeSnapshotRef": map[string]any{"namespace": "shop", "name": "pre", "uid": "u-pre"}},
		"status": map[string]any{"snapshotHandle": bankSnap}}})
	api.Put(t, pendingClaim("shop", "r3", "u-r3", "n2", fromSnapshot("pre")))
	readAs(t, az, "n2", "shop/r3", peer.SourceSnapshot, bankSnap, "VolumeSnapshot shop/pre is not the snapshot "+bankSnap)
	readAs(t, az, "n2", "shop/r3", peer.SourceSnapshot, preSnap, "")

	// bank's own restore of its snapshot is read.
	api.Put(t, pendingClaim("bank", "restore", "u-restore", "n2", fromSnapshot("nightly")))
	readAs(t, az, "n2", "bank/restore", peer.SourceSnapshot, bankSnap, "")
}

// groupMember puts in api the member of the VolumeGroupSnapshot groupUID
// (in ns) of the volume volumeID as external-snapshotter v8's snapshot
// controller makes it: a VolumeSnapshot and a content both named after
// sha256(groupUID+volumeID), the snapshot owned by the group, the
// content's spec naming the volume and its status the handle. It returns
// the member's VolumeSnapshot name and the snapshot this plugin made.
func groupMember(t *testing.T, api *peertest.API, ns, groupUID, volumeID, uid string) (name, made string) {
	t.Helper()
	sum := fmt.Sprintf("%x", sha256.Sum256([]byte(groupUID+volumeID)))
	name, content := "snapshot-"+sum, "snapcontent-"+sum
	storeID, volNode := splitID(volumeID)
	// The csi-snapshotter's group name (--groupsnapshot-name-prefix) and
	// this plugin's name of its member.
	made = blockdev.SnapshotID(blockdev.GroupSnapshotID("groupsnapshot-"+groupUID)+"/"+storeID) + "-" + volNode
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": uid,
			"ownerReferences": []any{map[string]any{"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
				"name": "db", "uid": groupUID, "controller": true}}},
		"spec":   map[string]any{"source": map[string]any{"persistentVolumeClaimName": "x"}},
		"status": map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": true, "volumeGroupSnapshotName": "db"}}})
	api.Put(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content,
			"annotations": map[string]any{"groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle": blockdev.GroupSnapshotID("groupsnapshot-"+groupUID) + "-" + volNode}},
		"spec": map[string]any{"driver": forgeDriver, "deletionPolicy": "Delete",
			"source":            map[string]any{"volumeHandle": volumeID},
			"volumeSnapshotRef": map[string]any{"kind": "VolumeSnapshot", "namespace": ns, "name": name, "uid": uid}},
		"status": map[string]any{"snapshotHandle": made, "readyToUse": true}}})
	return name, made
}

// TestPeerReadRestoreOfGroupMember: a member of a group snapshot is
// restored on another node. Its content, which the snapshot controller
// makes, names the member's volume in spec and the member's handle only
// in status; the member's snapshot is the one this plugin made of that
// volume in the group the csi-snapshotter names after the group's uid,
// which the content's name (sha256 of that uid and the volume, never
// writable) proves. The owner the member's VolumeSnapshot names, which
// its namespace may edit, is taken only when the content's name agrees.
func TestPeerReadRestoreOfGroupMember(t *testing.T) {
	api := peertest.New()
	az := &APIAuthorizer{API: api.Client, Driver: forgeDriver}
	logVol := tagged(blockdev.VolumeID("pvc-u-log"), "n1")
	dataVol := tagged(blockdev.VolumeID("pvc-u-data"), "n1")
	logSnap, logMade := groupMember(t, api, "bank", "u-group", logVol, "u-logsnap")
	_, dataMade := groupMember(t, api, "bank", "u-group", dataVol, "u-datasnap")
	api.Put(t, pendingClaim("bank", "log-restore", "u-lr", "n2", fromSnapshot(logSnap)))
	readAs(t, az, "n2", "bank/log-restore", peer.SourceSnapshot, logMade, "")
	// The group's other member is not this snapshot.
	readAs(t, az, "n2", "bank/log-restore", peer.SourceSnapshot, dataMade, "is not the snapshot "+dataMade)

	// The member's snapshot said to be owned by another group: its
	// content's name is not that group's.
	otherMade := blockdev.SnapshotID(blockdev.GroupSnapshotID("groupsnapshot-u-other")+"/"+blockdev.VolumeID("pvc-u-log")) + "-" + NodeTag("n1")
	vs, err := api.Client.Resource(kubeapi.VolumeSnapshots).Namespace("bank").Get(context.Background(), logSnap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vs.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "groupsnapshot.storage.k8s.io/v1", Kind: "VolumeGroupSnapshot", Name: "other", UID: "u-other"}})
	api.Put(t, vs)
	readAs(t, az, "n2", "bank/log-restore", peer.SourceSnapshot, otherMade, "is not the snapshot "+otherMade)
}
