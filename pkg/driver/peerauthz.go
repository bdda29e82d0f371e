package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
}

// The annotation of a claim that the scheduler sets to the node it picked.
const annSelectedNode = "volume.kubernetes.io/selected-node"

// APIAuthorizer is the PeerAuthorizer of a cluster: it reads the claims,
// volumes, snapshots and classes the calls name (none cached: the calls
// are rare, and a claim may change between them).
type APIAuthorizer struct {
	API    *kubeapi.Client
	Driver string // the CSI driver name, which the objects must name
}

var _ PeerAuthorizer = (*APIAuthorizer)(nil)

type objectRef struct {
	APIGroup  string `json:"apiGroup"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type claimObject struct {
	Metadata struct {
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		DataSource                *objectRef `json:"dataSource"`
		DataSourceRef             *objectRef `json:"dataSourceRef"`
		VolumeName                string     `json:"volumeName"`
		VolumeAttributesClassName *string    `json:"volumeAttributesClassName"`
		Resources                 struct {
			Requests map[string]string `json:"requests"`
		} `json:"resources"`
	} `json:"spec"`
}

type pvObject struct {
	Spec struct {
		CSI *struct {
			Driver       string `json:"driver"`
			VolumeHandle string `json:"volumeHandle"`
		} `json:"csi"`
		ClaimRef *struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			UID       string `json:"uid"`
		} `json:"claimRef"`
	} `json:"spec"`
}

// get reads the object at path, what in errors: a missing object is
// PermissionDenied naming it.
func (a *APIAuthorizer) get(ctx context.Context, path, what string, v any) error {
	body, err := a.API.Get(ctx, path, nil)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return status.Errorf(codes.PermissionDenied, "peer call refused: %s does not exist", what)
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "peer call: get %s: %v", what, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return status.Errorf(codes.Unavailable, "peer call: %s: %v", what, err)
	}
	return nil
}

func denied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, "peer call refused: "+format, args...)
}

func esc(s string) string { return url.PathEscape(s) }

// Read allows the read when the claim is scheduled to node, not bound
// yet, and its data source is the snapshot or claim whose bound object has
// the CSI ID source. A data source in another namespace is not followed.
func (a *APIAuthorizer) Read(ctx context.Context, node, claim string, kind peer.SourceKind, source string) error {
	ns, name, ok := strings.Cut(claim, "/")
	if !ok || ns == "" || name == "" {
		return denied("the read of %s %s names no claim (the provisioner's --extra-create-metadata gives it)", kind, source)
	}
	what := "claim " + claim
	var pvc claimObject
	if err := a.get(ctx, "/api/v1/namespaces/"+esc(ns)+"/persistentvolumeclaims/"+esc(name), what, &pvc); err != nil {
		return err
	}
	if sel := pvc.Metadata.Annotations[annSelectedNode]; sel != node {
		return denied("%s is not scheduled to node %s (its %s is %q), so that node may not read %s %s", what, node, annSelectedNode, sel, kind, source)
	}
	// A claim's volume is made (and its data read) before it binds: a
	// bound claim asks for no more reads, whoever edits its annotation.
	if pvc.Spec.VolumeName != "" {
		return denied("%s is bound already (to %s), so it asks for no read of %s %s", what, pvc.Spec.VolumeName, kind, source)
	}
	src := pvc.Spec.DataSourceRef
	if src == nil {
		src = pvc.Spec.DataSource
	}
	if src == nil || (src.Namespace != "" && src.Namespace != ns) {
		return denied("%s has no data source in its namespace, so it reads no %s %s", what, kind, source)
	}
	switch kind {
	case peer.SourceSnapshot:
		if src.Kind != "VolumeSnapshot" || src.APIGroup != "snapshot.storage.k8s.io" {
			return denied("the data source of %s is %s %s, not a VolumeSnapshot", what, src.Kind, src.Name)
		}
		return a.snapshotIs(ctx, ns, src.Name, source)
	case peer.SourceVolume:
		if src.Kind != "PersistentVolumeClaim" || src.APIGroup != "" {
			return denied("the data source of %s is %s %s, not a PersistentVolumeClaim", what, src.Kind, src.Name)
		}
		var from claimObject
		if err := a.get(ctx, "/api/v1/namespaces/"+esc(ns)+"/persistentvolumeclaims/"+esc(src.Name), "claim "+ns+"/"+src.Name, &from); err != nil {
			return err
		}
		var pv pvObject
		if err := a.get(ctx, "/api/v1/persistentvolumes/"+esc(from.Spec.VolumeName), "persistent volume "+from.Spec.VolumeName+" of claim "+ns+"/"+src.Name, &pv); err != nil {
			return err
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != a.Driver || pv.Spec.CSI.VolumeHandle != source {
			return denied("claim %s/%s (the data source of %s) is not bound to the volume %s", ns, src.Name, what, source)
		}
		return nil
	}
	return denied("unknown %v", kind)
}

// snapshotIs allows the read when the VolumeSnapshot ns/name is bound to
// a content of this driver whose snapshot handle is source.
func (a *APIAuthorizer) snapshotIs(ctx context.Context, ns, name, source string) error {
	what := "VolumeSnapshot " + ns + "/" + name
	var vs struct {
		Status struct {
			Content string `json:"boundVolumeSnapshotContentName"`
		} `json:"status"`
	}
	if err := a.get(ctx, "/apis/snapshot.storage.k8s.io/v1/namespaces/"+esc(ns)+"/volumesnapshots/"+esc(name), what, &vs); err != nil {
		return err
	}
	if vs.Status.Content == "" {
		return denied("%s is bound to no content", what)
	}
	var c struct {
		Spec struct {
			Driver string `json:"driver"`
			Source struct {
				SnapshotHandle string `json:"snapshotHandle"`
			} `json:"source"`
		} `json:"spec"`
		Status struct {
			SnapshotHandle string `json:"snapshotHandle"`
		} `json:"status"`
	}
	if err := a.get(ctx, "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/"+esc(vs.Status.Content), "VolumeSnapshotContent "+vs.Status.Content+" of "+what, &c); err != nil {
		return err
	}
	handle := c.Status.SnapshotHandle
	if handle == "" {
		handle = c.Spec.Source.SnapshotHandle
	}
	if c.Spec.Driver != a.Driver || handle != source {
		return denied("%s is not the snapshot %s", what, source)
	}
	return nil
}

// boundClaim returns the claim bound to the PV pv, which must be of this
// driver's volume volumeID.
func (a *APIAuthorizer) boundClaim(ctx context.Context, volumeID, pv string) (claimObject, string, error) {
	what := "persistent volume " + pv + " of volume " + volumeID
	var v pvObject
	if err := a.get(ctx, "/api/v1/persistentvolumes/"+esc(pv), what, &v); err != nil {
		return claimObject{}, "", err
	}
	if v.Spec.CSI == nil || v.Spec.CSI.Driver != a.Driver || v.Spec.CSI.VolumeHandle != volumeID {
		return claimObject{}, "", denied("persistent volume %s is not the volume %s", pv, volumeID)
	}
	ref := v.Spec.ClaimRef
	if ref == nil {
		return claimObject{}, "", denied("%s is bound to no claim", what)
	}
	claim := "claim " + ref.Namespace + "/" + ref.Name
	var c claimObject
	if err := a.get(ctx, "/api/v1/namespaces/"+esc(ref.Namespace)+"/persistentvolumeclaims/"+esc(ref.Name), claim+" of "+what, &c); err != nil {
		return claimObject{}, "", err
	}
	if c.Metadata.UID != ref.UID || c.Spec.VolumeName != pv {
		return claimObject{}, "", denied("%s is not bound to %s", claim, what)
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
	var vac struct {
		DriverName string            `json:"driverName"`
		Parameters map[string]string `json:"parameters"`
	}
	what := "VolumeAttributesClass " + name + " of " + claim
	err = a.get(ctx, "/apis/storage.k8s.io/v1/volumeattributesclasses/"+esc(name), what, &vac)
	if status.Code(err) == codes.PermissionDenied { // a cluster that serves only v1beta1
		err = a.get(ctx, "/apis/storage.k8s.io/v1beta1/volumeattributesclasses/"+esc(name), what, &vac)
	}
	if err != nil {
		return err
	}
	if vac.DriverName != a.Driver || !maps.Equal(vac.Parameters, params) {
		return denied("%s asks for VolumeAttributesClass %s, whose driver or parameters are not the call's", claim, name)
	}
	return nil
}

// Expand allows a size up to what the volume's claim asks for.
func (a *APIAuthorizer) Expand(ctx context.Context, volumeID, pv string, required int64) error {
	c, claim, err := a.boundClaim(ctx, volumeID, pv)
	if err != nil {
		return err
	}
	q := c.Spec.Resources.Requests["storage"]
	asked, err := storageBytes(q)
	if err != nil {
		return denied("%s asks for a storage size this plugin does not read (%q): %v", claim, q, err)
	}
	if required > asked {
		return denied("%s asks for %s (%d bytes), less than the %d bytes of the call", claim, q, asked, required)
	}
	return nil
}

// storageBytes reads a claim's storage request as the API server keeps
// it (canonical): an integer with an optional binary (Ki to Ei) or decimal
// (k to E) suffix.
func storageBytes(q string) (int64, error) {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"Ei", 1 << 60}, {"Pi", 1 << 50}, {"Ti", 1 << 40}, {"E", 1e18}, {"P", 1e15}, {"T", 1e12}} {
		if num, ok := strings.CutSuffix(q, u.suffix); ok {
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil || n < 0 || n > math.MaxInt64/u.mult {
				return 0, fmt.Errorf("size %q: want an integer with a suffix", q)
			}
			return n * u.mult, nil
		}
	}
	return ParseBytes(q)
}
