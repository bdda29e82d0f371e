package nodeloss

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

const (
	testDriver = "fastblk.csi.io"
	topoKey    = "topology.fastblk.csi.io/node"
)

// volume is a bound PV of the driver on node for claim ns/name (uid).
func volume(name, node, ns, claim, uid string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: testDriver, VolumeHandle: "v" + strings.Repeat("1", 32) + "-" + node}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: claim, UID: types.UID(uid)},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topoKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

// TestReleaseFollowsThePolicy: the claim of a deleted node's volume is
// released (its PV kept: Retain and annotated; the claim deleted; an
// event) when its own annotation says so, else its class's, else the
// default; a claim that is not released gets one event saying why, and a
// claim not placed on that node (its selected node another) is never
// released.
func TestReleaseFollowsThePolicy(t *testing.T) {
	for _, tc := range []struct {
		name             string
		class, claimAnn  string // "" : none
		selected         string
		defaultOn, wantR bool
		why              string
	}{
		{name: "class says release", class: "replicated", selected: "n2", wantR: true, why: "StorageClass replicated's annotation"},
		{name: "default off", class: "plain", selected: "n2", wantR: false, why: "nodeLoss.releaseClaims is false"},
		{name: "default on", class: "plain", selected: "n2", defaultOn: true, wantR: true, why: "nodeLoss.releaseClaims is true"},
		{name: "claim says release", class: "plain", claimAnn: "true", selected: "n2", wantR: true, why: "the claim's annotation"},
		{name: "claim says keep, over its class", class: "replicated", claimAnn: "false", selected: "n2", wantR: false, why: "the claim's annotation"},
		{name: "placed elsewhere", class: "replicated", selected: "n1", wantR: false, why: `its selected node is "n1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			api := peertest.New()
			api.Put(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "replicated", Annotations: map[string]string{AnnRelease: "true"}}, Provisioner: testDriver})
			api.Put(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Provisioner: testDriver})
			claim := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "data-0", UID: "uid-1", Annotations: map[string]string{annSelectedNode: tc.selected}},
				Spec:       corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(tc.class), VolumeName: "pv-1"},
			}
			if tc.claimAnn != "" {
				claim.Annotations[AnnRelease] = tc.claimAnn
			}
			api.Put(t, claim)
			pv := volume("pv-1", "n2", "db", "data-0", "uid-1")
			api.Put(t, pv)
			r := &Releaser{API: api.Client, Driver: testDriver, TopologyKey: topoKey, Default: tc.defaultOn}
			for range 2 { // a second pass changes nothing more
				if err := r.release(ctx, pv, "n2"); err != nil {
					t.Fatal(err)
				}
			}
			_, err := kubeapi.Get[corev1.PersistentVolumeClaim](ctx, api.Client, kubeapi.PersistentVolumeClaims, "db", "data-0")
			if released := apierrors.IsNotFound(err); released != tc.wantR {
				t.Fatalf("claim released %v (%v), want %v", released, err, tc.wantR)
			}
			got, err := kubeapi.Get[corev1.PersistentVolume](ctx, api.Client, kubeapi.PersistentVolumes, "", "pv-1")
			if err != nil {
				t.Fatal(err)
			}
			kept := got.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain && got.Annotations[AnnReleasedClaim] == "db/data-0" &&
				got.Annotations[AnnReleasedNode] == "n2"
			if kept != tc.wantR {
				t.Errorf("PV: reclaim %s, annotations %v; want kept (Retain, annotated) %v", got.Spec.PersistentVolumeReclaimPolicy, got.Annotations, tc.wantR)
			}
			if got.Spec.ClaimRef == nil || got.Spec.CSI.VolumeHandle != pv.Spec.CSI.VolumeHandle {
				t.Error("the PV lost its claim reference or its volume")
			}
			evs, err := api.Client.Resource(kubeapi.Events).Namespace("db").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != 1 {
				t.Fatalf("%d events on the claim, want 1", len(evs.Items))
			}
			msg, _, _ := unstructured.NestedString(evs.Items[0].Object, "message")
			reason, _, _ := unstructured.NestedString(evs.Items[0].Object, "reason")
			wantReason := map[bool]string{true: "ReleasedFromDeletedNode", false: "NodeDeleted"}[tc.wantR]
			if reason != wantReason || !strings.Contains(msg, tc.why) || !strings.Contains(msg, "node n2 was deleted") {
				t.Errorf("event %s: %q; want %s saying %q", reason, msg, wantReason, tc.why)
			}
		})
	}
}

// TestVolumeNode: the node of a PV is its node affinity's value on the
// driver's key, for PVs of the driver only.
func TestVolumeNode(t *testing.T) {
	pv := volume("pv", "n2", "db", "c", "u")
	if got := VolumeNode(pv, testDriver, topoKey); got != "n2" {
		t.Errorf("VolumeNode = %q, want n2", got)
	}
	if got := VolumeNode(pv, "other.csi.io", topoKey); got != "" {
		t.Errorf("VolumeNode of another driver's PV = %q, want none", got)
	}
	pv.Spec.NodeAffinity = nil
	if got := VolumeNode(pv, testDriver, topoKey); got != "" {
		t.Errorf("VolumeNode without affinity = %q, want none", got)
	}
}
