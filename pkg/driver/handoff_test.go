package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

// handoffSetup is authzNodes with n1's snapshot nightly and the classes
// "handoff" (the driver's, handing off, preallocated with falloc) and
// "pull" (the driver's, pulling); it returns the snapshot.
func handoffSetup(t *testing.T) (n1, n2 *testNode, api *peertest.API, snap string) {
	t.Helper()
	n1, n2, api = authzNodes(t)
	_, snap = n1.source(8<<20, [][2]int64{{0, 1 << 20}})
	snapshotObjects(t, api, n1.d.cfg.Name, "nightly", snap)
	for name, params := range map[string]map[string]string{
		"handoff": {ParamCrossNodeSource: "handoff", ParamPreallocation: "falloc", "csi.storage.k8s.io/fstype": "ext4"},
		"pull":    {ParamCrossNodeSource: "pull"},
	} {
		api.Put(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: n1.d.cfg.Name, Parameters: params})
	}
	return n1, n2, api, snap
}

// restoreClaim is the claim shop/name (uid) of class, asking size,
// restoring nightly on n2.
func restoreClaim(name, uid, class, size string) *corev1.PersistentVolumeClaim {
	c := claim(name, uid, "n2", fromSnapshot("nightly"), "", "", size)
	c.Spec.StorageClassName = &class
	return c
}

// handOff is n2's CreateVolume of the volume name from snap for the claim
// shop/claim, handed off to n1, asking size bytes and, in its own
// parameters, full preallocation.
func handOff(n2 *testNode, name, claim, snap string, size int64) (*csi.Volume, error) {
	params := map[string]string{ParamCrossNodeSource: "handoff", ParamPreallocation: "full", ParamPVCNamespace: "shop", ParamPVCName: claim}
	return n2.createFrom(name, size, snapshotSource(snap), params, time.Minute)
}

// refusePVs makes the fake API server refuse to create PVs while the
// returned flag is set (from now on), so that the volumes handoffs make
// on n1 wait for their PVs: n1 makes the volume and answers Unavailable.
func refusePVs(api *peertest.API) *atomic.Bool {
	var on atomic.Bool
	on.Store(true)
	api.Client.PrependReactor("create", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if on.Load() {
			return true, nil, fmt.Errorf("the API server refuses PVs")
		}
		return false, nil, nil
	})
	return &on
}

// handOffWaiting is handOff of a volume whose PV n1 cannot make: it
// returns the ID of the volume n1 made.
func handOffWaiting(t *testing.T, n1, n2 *testNode, name, claim, snap string, size int64) string {
	t.Helper()
	if _, err := handOff(n2, name, claim, snap, size); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "make PV") {
		t.Fatalf("handoff of %s: %v; want the volume made and its PV refused (Unavailable)", name, err)
	}
	for _, v := range n1.d.store.Volumes() {
		if v.Name == name {
			return n1.d.publicID(v.ID)
		}
	}
	t.Fatalf("n1 has no volume %s", name)
	return ""
}

// TestHandoffMadeAsTheClaimAsks is finding 5: the volume a handoff makes
// on n1 has the name, size, parameters (preallocation included) and
// attributes the claim and its classes ask for, whatever n2's request
// says; a request under another name than the provisioner's (from the
// claim's uid), or for a claim whose class does not hand off, is refused.
// Before, n1 made whatever n2 asked for.
func TestHandoffMadeAsTheClaimAsks(t *testing.T) {
	requireRoot(t)
	n1, n2, api, snap := handoffSetup(t)
	c := restoreClaim("restore", "u1", "handoff", "16Mi")
	gold := "gold"
	c.Spec.VolumeAttributesClassName = &gold
	api.Put(t, c)
	api.Put(t, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: gold}, DriverName: n1.d.cfg.Name, Parameters: map[string]string{ParamMaxIOPS: "0"}})
	api.Put(t, restoreClaim("pulled", "u2", "pull", "16Mi"))

	v, err := handOff(n2, "pvc-u1", "restore", snap, 512<<20)
	if err != nil {
		t.Fatalf("handoff for the claim: %v", err)
	}
	got, err := n1.d.store.Volume(storeVolumeID(v.GetVolumeId()))
	if err != nil {
		t.Fatal(err)
	}
	if v.GetCapacityBytes() != 16<<20 || got.SizeBytes != 16<<20 || got.Preallocation != blockdev.PreallocFalloc ||
		got.Params[ParamPVName] != "pvc-u1" || got.MutableParams[ParamMaxIOPS] != "0" || got.HandoffPeer != "" {
		t.Errorf("n1's volume: %d bytes (answered %d), preallocation %q, params %v, mutable %v, waiting for %q; want the claim's 16 MiB, the class's falloc, its PV's name, the attributes class's maxIOPS, its PV made",
			got.SizeBytes, v.GetCapacityBytes(), got.Preallocation, got.Params, got.MutableParams, got.HandoffPeer)
	}
	// n1 made the PV (no node may make another node's), pre-bound to the
	// claim.
	pv, err := kubeapi.Get[corev1.PersistentVolume](context.Background(), api.Client, kubeapi.PersistentVolumes, "", "pvc-u1")
	if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != v.GetVolumeId() || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != "u1" {
		t.Errorf("the PV of the handed-off volume: %+v, %v; want pvc-u1 of volume %s bound to claim uid u1", pv, err, v.GetVolumeId())
	}
	for _, tc := range []struct{ name, claim, says string }{
		{"attack-1", "restore", "the volume a handoff makes for claim shop/restore is pvc-u1"},
		{"pvc-u2", "pulled", "StorageClass pull of claim shop/pulled is not one of driver fastblk.csi.io that hands off"},
	} {
		if _, err := handOff(n2, tc.name, tc.claim, snap, 512<<20); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("handoff of %s for %s: %v; want PermissionDenied saying %q", tc.name, tc.claim, err, tc.says)
		}
	}
	if n := len(n1.d.store.Volumes()); n != 2 {
		t.Errorf("n1 has %d volumes, want its source and the claim's", n)
	}
}

// TestHandoffLimitPerPeer: n1 holds at most PerPeer volumes made by n2's
// handoffs whose PVs have not come, and at most BytesPerPeer in them
// unless n2 has none waiting; beyond either a handoff is Unavailable
// naming the flag. A repeat takes no new place; a volume whose PV came
// (seen by a pass of the reaper) frees its place.
func TestHandoffLimitPerPeer(t *testing.T) {
	requireRoot(t)
	n1, n2, api, snap := handoffSetup(t)
	n1.d.cfg.Handoffs = HandoffLimits{PerPeer: 3, BytesPerPeer: 40 << 20}
	for i, size := range []string{"16Mi", "16Mi", "16Mi", "16Mi", "64Mi"} {
		api.Put(t, restoreClaim(fmt.Sprint("c", i), fmt.Sprint("u", i), "handoff", size))
	}
	refusing := refusePVs(api)
	put := func(pv *corev1.PersistentVolume) {
		refusing.Store(false)
		api.Put(t, pv)
		refusing.Store(true)
	}
	handOffClaim := func(i int) (*csi.Volume, error) {
		return handOff(n2, fmt.Sprint("pvc-u", i), fmt.Sprint("c", i), snap, 16<<20)
	}
	waiting := func(i int) string {
		t.Helper()
		return handOffWaiting(t, n1, n2, fmt.Sprint("pvc-u", i), fmt.Sprint("c", i), snap, 16<<20)
	}
	unavailable := func(i int, says string) {
		t.Helper()
		if _, err := handOffClaim(i); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), says) {
			t.Errorf("handoff %d: %v; want Unavailable saying %q", i, err, says)
		}
	}
	made := []string{waiting(0), waiting(1)}
	unavailable(2, "--peer-max-handoff-bytes-per-peer")
	if again := waiting(0); again != made[0] {
		t.Errorf("repeated handoff 0 made %s, want %s again", again, made[0])
	}
	// c0's PV came.
	put(pvOf("pvc-u0", n1.d.cfg.Name, made[0], "c0", "u0"))
	n1.d.reapHandoffs(context.Background(), time.Now())
	waiting(2)
	unavailable(3, "--peer-max-handoff-bytes-per-peer")
	n1.d.cfg.Handoffs.BytesPerPeer = 1 << 30
	api.Put(t, restoreClaim("c5", "u5", "handoff", "16Mi"))
	waiting(3)
	unavailable(5, "--peer-max-handoffs-per-peer")
	// With none waiting, a volume above BytesPerPeer is made; its PV
	// comes at once, and it takes no place.
	n1.d.cfg.Handoffs.BytesPerPeer = 32 << 20
	for _, v := range n1.d.store.Volumes() {
		if v.HandoffPeer != "" {
			put(pvOf(v.Name, n1.d.cfg.Name, n1.d.publicID(v.ID), "x", "x"))
		}
	}
	n1.d.reapHandoffs(context.Background(), time.Now())
	refusing.Store(false)
	if v, err := handOff(n2, "pvc-u4", "c4", snap, 64<<20); err != nil || v.GetCapacityBytes() != 64<<20 {
		t.Errorf("handoff of 64 MiB with none waiting: %v, %v", v, err)
	}
	if _, err := handOffClaim(5); err != nil {
		t.Errorf("handoff 5 after the PVs came: %v", err)
	}
}

// TestHandoffWithoutPVRemoved: a volume a handoff made whose PV does not
// come within ReapAfter is removed, also by the plugin started anew on
// the same directory (the record names the peer); one whose PV came is
// kept for good, past the bound too; nothing is removed while the API
// server cannot say; a second pass is a no-op.
func TestHandoffWithoutPVRemoved(t *testing.T) {
	requireRoot(t)
	n1, n2, api, snap := handoffSetup(t)
	n1.d.cfg.Handoffs.ReapAfter = time.Hour
	api.Put(t, restoreClaim("lost", "u1", "handoff", "16Mi"))
	api.Put(t, restoreClaim("kept", "u2", "handoff", "16Mi"))
	refusing := refusePVs(api)
	lost := handOffWaiting(t, n1, n2, "pvc-u1", "lost", snap, 16<<20)
	kept := handOffWaiting(t, n1, n2, "pvc-u2", "kept", snap, 16<<20)
	refusing.Store(false)
	api.Put(t, pvOf("pvc-u2", n1.d.cfg.Name, kept, "kept", "u2"))
	ctx := context.Background()
	has := func(n *testNode, vol string) bool {
		_, err := n.d.store.Volume(storeVolumeID(vol))
		return err == nil
	}
	n1.d.reapHandoffs(ctx, time.Now())
	if !has(n1, lost) || !has(n1, kept) {
		t.Fatal("a pass within the bound removed a volume")
	}
	later := time.Now().Add(time.Hour + time.Second)
	api.Client.PrependReactor("get", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("the API server is away")
	})
	n1.d.reapHandoffs(ctx, later)
	if !has(n1, lost) {
		t.Fatal("a pass that could not read PVs removed a volume")
	}
	api.Client.ReactionChain = api.Client.ReactionChain[1:]

	// The plugin starts anew on n1's directory.
	n1.d.store.def.Close()
	re := newTestNodeWith(t, n1.dir, "n1", "loop")
	re.d.cfg.PeerAuthz, re.d.cfg.Handoffs = n1.d.cfg.PeerAuthz, n1.d.cfg.Handoffs
	for range 2 {
		re.d.reapHandoffs(ctx, later)
	}
	if has(re, lost) || !has(re, kept) {
		t.Errorf("after the bound: the volume without a PV is there: %v, the one with its PV: %v; want only the second", has(re, lost), has(re, kept))
	}
	if _, err := os.Stat(re.file(lost)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed volume's file: %v, want it gone", err)
	}
	if v, _ := re.d.store.Volume(storeVolumeID(kept)); v.HandoffPeer != "" {
		t.Errorf("the volume whose PV came still names its peer %q", v.HandoffPeer)
	}
}
