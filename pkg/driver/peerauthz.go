package driver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// A peer's call is authenticated (pkg/peer: its token proves its node),
// and then authorized by the API server's objects: a node may read a
// source's data, or have a volume made from it here, only for a claim
// scheduled to that node whose data source is that source; and any node
// (the resizer's leader's) may modify or expand a volume only as its
// claim asks. So what a stolen node can have of another node is what the
// cluster's own objects already ask for, and making such objects is
// checked by Kubernetes' RBAC in the claim's namespace, not by the plugin.

// PeerAuthorizer says whether the API server's objects ask for what a
// peer's call asks. Each method returns nil, PermissionDenied naming the
// object missing or not asking for it, or Unavailable when the API server
// cannot say.
type PeerAuthorizer interface {
	// Read: node may read the source of kind with the CSI ID source
	// (ReadData, or a handoff of a volume made from it) for the claim
	// <namespace>/<name>.
	Read(ctx context.Context, node, claim string, kind peer.SourceKind, source string) error
	// Modify: the volume (CSI ID, its PV's name) may take params.
	Modify(ctx context.Context, volumeID, pv string, params map[string]string) error
	// Expand: the volume may grow to required bytes.
	Expand(ctx context.Context, volumeID, pv string, required int64) error
	// Handoff returns what the claim <namespace>/<name> asks of the
	// volume a handoff makes for it (after Read allowed the read of its
	// source): the volume's name, size, parameters and mutable
	// parameters, never the caller's.
	Handoff(ctx context.Context, claim string) (*csi.CreateVolumeRequest, error)
	// HasPV reports whether the PV pv exists and holds the CSI volume
	// volumeID, or an error when the API server cannot say.
	HasPV(ctx context.Context, pv, volumeID string) (bool, error)
}

// The annotation of a claim that the scheduler sets to the node it picked.
const annSelectedNode = "volume.kubernetes.io/selected-node"

// APIAuthorizer is the PeerAuthorizer of a cluster: it reads the claims,
// volumes, snapshots and classes the calls name from the API server (none
// cached: the calls are rare, and a claim may change between them).
type APIAuthorizer struct {
	API    dynamic.Interface
	Driver string // the CSI driver name, which the objects must name
}

var _ PeerAuthorizer = (*APIAuthorizer)(nil)

// got turns the error of a read of what into the call's: a missing object
// is PermissionDenied naming it, any other failure Unavailable.
func got(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.PermissionDenied, "peer call refused: %s does not exist", what)
	}
	return status.Errorf(codes.Unavailable, "peer call: get %s: %v", what, err)
}

func denied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, "peer call refused: "+format, args...)
}

func (a *APIAuthorizer) claim(ctx context.Context, ns, name, what string) (*corev1.PersistentVolumeClaim, error) {
	c, err := kubeapi.Get[corev1.PersistentVolumeClaim](ctx, a.API, kubeapi.PersistentVolumeClaims, ns, name)
	return c, got(err, what)
}

func (a *APIAuthorizer) volume(ctx context.Context, name, what string) (*corev1.PersistentVolume, error) {
	v, err := kubeapi.Get[corev1.PersistentVolume](ctx, a.API, kubeapi.PersistentVolumes, "", name)
	return v, got(err, what)
}

// Read allows the read when the claim is scheduled to node, not bound
// yet, and its data source is the snapshot or claim whose bound object has
// the CSI ID source. A data source in another namespace is not followed.
func (a *APIAuthorizer) Read(ctx context.Context, node, claim string, kind peer.SourceKind, source string) error {
	ns, name, ok := strings.Cut(claim, "/")
	if !ok || ns == "" || name == "" {
		return denied("the read of %s %s names no claim (the provisioner's --extra-create-metadata gives it)", kind, source)
	}
	what := "claim " + claim
	pvc, err := a.claim(ctx, ns, name, what)
	if err != nil {
		return err
	}
	if sel := pvc.Annotations[annSelectedNode]; sel != node {
		return denied("%s is not scheduled to node %s (its %s is %q), so that node may not read %s %s", what, node, annSelectedNode, sel, kind, source)
	}
	// A claim's volume is made (and its data read) before it binds: a
	// bound claim asks for no more reads, whoever edits its annotation.
	if pvc.Spec.VolumeName != "" {
		return denied("%s is bound already (to %s), so it asks for no read of %s %s", what, pvc.Spec.VolumeName, kind, source)
	}
	var group, srcKind, srcName string
	switch ref, src := pvc.Spec.DataSourceRef, pvc.Spec.DataSource; {
	case ref != nil && (ref.Namespace == nil || *ref.Namespace == "" || *ref.Namespace == ns):
		group, srcKind, srcName = ptr.Deref(ref.APIGroup, ""), ref.Kind, ref.Name
	case ref == nil && src != nil:
		group, srcKind, srcName = ptr.Deref(src.APIGroup, ""), src.Kind, src.Name
	default:
		return denied("%s has no data source in its namespace, so it reads no %s %s", what, kind, source)
	}
	switch kind {
	case peer.SourceSnapshot:
		if srcKind != "VolumeSnapshot" || group != kubeapi.VolumeSnapshots.Group {
			return denied("the data source of %s is %s %s, not a VolumeSnapshot", what, srcKind, srcName)
		}
		return a.snapshotIs(ctx, ns, srcName, source)
	case peer.SourceVolume:
		if srcKind != "PersistentVolumeClaim" || group != "" {
			return denied("the data source of %s is %s %s, not a PersistentVolumeClaim", what, srcKind, srcName)
		}
		return a.cloneSourceIs(ctx, ns, srcName, what, source)
	}
	return denied("unknown %v", kind)
}

// cloneSourceIs allows the read of the volume source for the clone
// claim what when the claim ns/name is Bound to the PV of that volume and
// the PV's claimRef names the claim, uid and all: as the
// external-provisioner checks before it clones. A claim's spec.volumeName
// alone is anyone's to write who may create claims (a claim pre-bound to
// another namespace's PV stays Pending); its status the node account may
// patch; a PV's status only the PV controller writes, and its claimRef,
// besides, only the provisioner of the PV's node, here the serving one
// (docs/peer.md, "Authorization from fields no node writes").
func (a *APIAuthorizer) cloneSourceIs(ctx context.Context, ns, name, what, source string) error {
	src := "claim " + ns + "/" + name
	from, err := a.claim(ctx, ns, name, src)
	if err != nil {
		return err
	}
	if from.Status.Phase != corev1.ClaimBound || from.Spec.VolumeName == "" {
		return denied("%s (the data source of %s) is not bound", src, what)
	}
	pv, err := a.volume(ctx, from.Spec.VolumeName, "persistent volume "+from.Spec.VolumeName+" of "+src)
	if err != nil {
		return err
	}
	if c := pv.Spec.CSI; c == nil || c.Driver != a.Driver || c.VolumeHandle != source {
		return denied("%s (the data source of %s) is not bound to the volume %s", src, what, source)
	}
	ref := pv.Spec.ClaimRef
	if pv.Status.Phase != corev1.VolumeBound || ref == nil || ref.Namespace != ns || ref.Name != name || ref.UID != from.UID {
		bound := "no claim"
		if ref != nil {
			bound = fmt.Sprintf("claim %s/%s (uid %s)", ref.Namespace, ref.Name, ref.UID)
		}
		return denied("persistent volume %s is bound to %s, not to %s (uid %s)", pv.Name, bound, src, from.UID)
	}
	return nil
}

// The csi-snapshotter names the snapshot it asks a plugin for
// "<prefix>-<uid of the content's spec.volumeSnapshotRef>", the prefix
// being its --snapshot-name-prefix, which the chart leaves at its default.
const snapshotNamePrefix = "snapshot"

// snapshotIs allows the read when the VolumeSnapshot ns/name is bound to
// a content of this driver that points back to it (its
// spec.volumeSnapshotRef, uid and all) and whose snapshot is source. The
// snapshot is taken from the content's spec, never its status, which the
// node account may patch: a pre-provisioned content names its handle in
// spec.source.snapshotHandle; the snapshot of a content the snapshot
// controller made (spec.source.volumeHandle) is the one the
// csi-snapshotter made of that volume and named after the
// volumeSnapshotRef's uid, whose ID this plugin derives from its name.
func (a *APIAuthorizer) snapshotIs(ctx context.Context, ns, name, source string) error {
	what := "VolumeSnapshot " + ns + "/" + name
	vs, err := a.API.Resource(kubeapi.VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err := got(err, what); err != nil {
		return err
	}
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	if content == "" {
		return denied("%s is bound to no content", what)
	}
	c, err := a.API.Resource(kubeapi.VolumeSnapshotContents).Get(ctx, content, metav1.GetOptions{})
	if err := got(err, "VolumeSnapshotContent "+content+" of "+what); err != nil {
		return err
	}
	str := func(fields ...string) string {
		s, _, _ := unstructured.NestedString(c.Object, fields...)
		return s
	}
	refNS, refName, refUID := str("spec", "volumeSnapshotRef", "namespace"), str("spec", "volumeSnapshotRef", "name"), str("spec", "volumeSnapshotRef", "uid")
	if refNS != ns || refName != name || refUID == "" || refUID != string(vs.GetUID()) {
		return denied("VolumeSnapshotContent %s of %s is the content of VolumeSnapshot %s/%s (uid %s), not of it (uid %s)",
			content, what, refNS, refName, refUID, vs.GetUID())
	}
	if str("spec", "driver") != a.Driver {
		return denied("%s is not the snapshot %s", what, source)
	}
	if handle := str("spec", "source", "snapshotHandle"); handle != "" {
		if handle != source {
			return denied("%s is not the snapshot %s", what, source)
		}
		return nil
	}
	volume := str("spec", "source", "volumeHandle")
	volID, volTag := splitID(volume)
	storeID, tag := splitID(source)
	if volTag != "" && volTag != tag {
		return denied("%s is not the snapshot %s", what, source)
	}
	if storeID == blockdev.SnapshotID(snapshotNamePrefix+"-"+refUID) {
		return nil
	}
	if group := groupOf(vs, content, volume); group != "" &&
		storeID == blockdev.SnapshotID(blockdev.GroupMemberName(blockdev.GroupSnapshotID(groupSnapshotNamePrefix+"-"+group), volID)) {
		return nil
	}
	return denied("%s is not the snapshot %s", what, source)
}

// The csi-snapshotter names the group snapshot it asks a plugin for
// "<prefix>-<uid of the VolumeGroupSnapshot>", the prefix being its
// --groupsnapshot-name-prefix, which the chart leaves at its default.
const groupSnapshotNamePrefix = "groupsnapshot"

// groupOf returns the uid of the VolumeGroupSnapshot whose member the
// snapshot vs, bound to the content of that name made of volume, is, or
// "". The snapshot controller (external-snapshotter v8) names a member's
// content "snapcontent-<hex sha256 of the group's uid and the volume>";
// a content's name never changes and no node may create one, so it
// proves the group. The owner vs names, which its namespace may edit,
// only says which uid to try.
func groupOf(vs *unstructured.Unstructured, content, volume string) string {
	for _, o := range vs.GetOwnerReferences() {
		if o.Kind != "VolumeGroupSnapshot" || o.UID == "" {
			continue
		}
		if content == fmt.Sprintf("snapcontent-%x", sha256.Sum256([]byte(string(o.UID)+volume))) {
			return string(o.UID)
		}
	}
	return ""
}

// boundClaim returns the claim bound to the PV pv, which must be of this
// driver's volume volumeID.
func (a *APIAuthorizer) boundClaim(ctx context.Context, volumeID, pv string) (*corev1.PersistentVolumeClaim, string, error) {
	what := "persistent volume " + pv + " of volume " + volumeID
	v, err := a.volume(ctx, pv, what)
	if err != nil {
		return nil, "", err
	}
	if c := v.Spec.CSI; c == nil || c.Driver != a.Driver || c.VolumeHandle != volumeID {
		return nil, "", denied("persistent volume %s is not the volume %s", pv, volumeID)
	}
	ref := v.Spec.ClaimRef
	if ref == nil {
		return nil, "", denied("%s is bound to no claim", what)
	}
	claim := "claim " + ref.Namespace + "/" + ref.Name
	c, err := a.claim(ctx, ref.Namespace, ref.Name, claim+" of "+what)
	if err != nil {
		return nil, "", err
	}
	if c.UID != ref.UID || c.Spec.VolumeName != pv {
		return nil, "", denied("%s is not bound to %s", claim, what)
	}
	return c, claim, nil
}

// Modify allows params when the volume's claim asks for a
// VolumeAttributesClass of this driver with exactly those parameters.
func (a *APIAuthorizer) Modify(ctx context.Context, volumeID, pv string, params map[string]string) error {
	c, claim, err := a.boundClaim(ctx, volumeID, pv)
	if err != nil {
		return err
	}
	if c.Spec.VolumeAttributesClassName == nil || *c.Spec.VolumeAttributesClassName == "" {
		return denied("%s asks for no VolumeAttributesClass", claim)
	}
	name := *c.Spec.VolumeAttributesClassName
	vac, err := a.attributesClass(ctx, name, claim)
	if err != nil {
		return err
	}
	if vac.DriverName != a.Driver || !maps.Equal(vac.Parameters, params) {
		return denied("%s asks for VolumeAttributesClass %s, whose driver or parameters are not the call's", claim, name)
	}
	return nil
}

// attributesClass reads the VolumeAttributesClass name that claim names.
func (a *APIAuthorizer) attributesClass(ctx context.Context, name, claim string) (*storagev1.VolumeAttributesClass, error) {
	vac, err := kubeapi.Get[storagev1.VolumeAttributesClass](ctx, a.API, kubeapi.VolumeAttributesClasses, "", name)
	if apierrors.IsNotFound(err) { // or a cluster that serves it only as v1beta1, whose fields are the same
		vac, err = kubeapi.Get[storagev1.VolumeAttributesClass](ctx, a.API, kubeapi.VolumeAttributesClassesBeta, "", name)
	}
	return vac, got(err, "VolumeAttributesClass "+name+" of "+claim)
}

// Expand allows a size up to what the volume's claim asks for.
func (a *APIAuthorizer) Expand(ctx context.Context, volumeID, pv string, required int64) error {
	c, claim, err := a.boundClaim(ctx, volumeID, pv)
	if err != nil {
		return err
	}
	q, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return denied("%s asks for no storage size", claim)
	}
	if asked := q.Value(); required > asked {
		return denied("%s asks for %s (%d bytes), less than the %d bytes of the call", claim, q.String(), asked, required)
	}
	return nil
}

// The external-provisioner names the volume (and the PV) of a claim
// "<prefix>-<claim uid>", the prefix being its --volume-name-prefix, which
// the chart leaves at its default.
const volumeNamePrefix = "pvc"

// Handoff returns the CreateVolume the provisioner would send for the
// claim: the name it gives the claim's volume; the claim's storage
// request and limit; the parameters of its StorageClass, which must be
// this driver's and hand off (crossNodeSource: handoff), without the
// provisioner's own csi.storage.k8s.io/ keys and with the claim's
// metadata (--extra-create-metadata); and the parameters of the
// VolumeAttributesClass it names.
func (a *APIAuthorizer) Handoff(ctx context.Context, claim string) (*csi.CreateVolumeRequest, error) {
	ns, name, _ := strings.Cut(claim, "/")
	what := "claim " + claim
	pvc, err := a.claim(ctx, ns, name, what)
	if err != nil {
		return nil, err
	}
	className := ptr.Deref(pvc.Spec.StorageClassName, "")
	if className == "" {
		return nil, denied("%s names no StorageClass, so nothing says how to make its volume", what)
	}
	sc, err := kubeapi.Get[storagev1.StorageClass](ctx, a.API, kubeapi.StorageClasses, "", className)
	if err := got(err, "StorageClass "+className+" of "+what); err != nil {
		return nil, err
	}
	if sc.Provisioner != a.Driver || sc.Parameters[ParamCrossNodeSource] != crossNodeHandoff {
		return nil, denied("StorageClass %s of %s is not one of driver %s that hands off (%s: %s)", className, what, a.Driver, ParamCrossNodeSource, crossNodeHandoff)
	}
	pv := volumeNamePrefix + "-" + string(pvc.UID)
	params := map[string]string{ParamPVCNamespace: ns, ParamPVCName: name, ParamPVName: pv}
	for k, v := range sc.Parameters {
		if !strings.HasPrefix(k, paramCSIPrefix) {
			params[k] = v
		}
	}
	req := &csi.CreateVolumeRequest{Name: pv, Parameters: params, CapacityRange: &csi.CapacityRange{}}
	if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		req.CapacityRange.RequiredBytes = q.Value()
	}
	if q, ok := pvc.Spec.Resources.Limits[corev1.ResourceStorage]; ok {
		req.CapacityRange.LimitBytes = q.Value()
	}
	if vac := ptr.Deref(pvc.Spec.VolumeAttributesClassName, ""); vac != "" {
		c, err := a.attributesClass(ctx, vac, what)
		if err != nil {
			return nil, err
		}
		if c.DriverName != a.Driver {
			return nil, denied("VolumeAttributesClass %s of %s is not of driver %s", vac, what, a.Driver)
		}
		req.MutableParameters = c.Parameters
	}
	return req, nil
}

// HasPV reports whether the PV pv exists and holds the volume volumeID of
// this driver.
func (a *APIAuthorizer) HasPV(ctx context.Context, pv, volumeID string) (bool, error) {
	v, err := kubeapi.Get[corev1.PersistentVolume](ctx, a.API, kubeapi.PersistentVolumes, "", pv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get persistent volume %s: %w", pv, err)
	}
	c := v.Spec.CSI
	return c != nil && c.Driver == a.Driver && c.VolumeHandle == volumeID, nil
}
