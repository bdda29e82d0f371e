package uninstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// topologyKey is the node label of the driver's volumes' node affinity.
const topologyKey = "topology.fastblk.csi.io/node"

// Volume is a PersistentVolume of the driver.
type Volume struct {
	Name, Claim, Phase, Node, ReclaimPolicy string
}

// Attachment is a VolumeAttachment of the driver.
type Attachment struct {
	Name, Volume, Node string
	Attached           bool
}

// Report is what of the driver is left in the cluster.
type Report struct {
	Driver      string
	Volumes     []Volume
	Attachments []Attachment
}

// InUse reports whether anything of the driver is left.
func (r Report) InUse() bool { return len(r.Volumes) > 0 || len(r.Attachments) > 0 }

// Check lists the PersistentVolumes and VolumeAttachments of driver.
func Check(ctx context.Context, c *kubeapi.Client, driver string) (Report, error) {
	r := Report{Driver: driver}
	err := c.List(ctx, "/api/v1/persistentvolumes", nil, func(raw json.RawMessage) error {
		var pvs []persistentVolume
		if err := json.Unmarshal(raw, &pvs); err != nil {
			return err
		}
		for _, pv := range pvs {
			if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
				continue
			}
			v := Volume{Name: pv.Metadata.Name, Phase: pv.Status.Phase, ReclaimPolicy: pv.Spec.ReclaimPolicy, Node: pv.node()}
			if ref := pv.Spec.ClaimRef; ref != nil {
				v.Claim = ref.Namespace + "/" + ref.Name
			}
			r.Volumes = append(r.Volumes, v)
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	err = c.List(ctx, "/apis/storage.k8s.io/v1/volumeattachments", nil, func(raw json.RawMessage) error {
		var vas []volumeAttachment
		if err := json.Unmarshal(raw, &vas); err != nil {
			return err
		}
		for _, va := range vas {
			if va.Spec.Attacher != driver {
				continue
			}
			r.Attachments = append(r.Attachments, Attachment{Name: va.Metadata.Name, Node: va.Spec.NodeName,
				Volume: va.Spec.Source.PersistentVolumeName, Attached: va.Status.Attached})
		}
		return nil
	})
	return r, err
}

// AllowAnnotation, set to "true" on the driver's CSIDriver object, lets the
// check pass with volumes left. It is the override that still works after a
// refused helm uninstall: Helm then keeps the release as "uninstalling" and
// refuses helm upgrade, so a chart value cannot be changed until helm
// rollback; the annotation goes with the CSIDriver when the uninstall
// completes.
const AllowAnnotation = "fastblk.csi.io/allow-uninstall-with-volumes"

// Allowed reports whether the driver's CSIDriver object carries
// AllowAnnotation="true" (false when there is no such object).
func Allowed(ctx context.Context, c *kubeapi.Client, driver string) (bool, error) {
	path := "/apis/storage.k8s.io/v1/csidrivers/" + url.PathEscape(driver)
	body, err := c.Get(ctx, path, nil)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %s: %w", path, err)
	}
	var d struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		return false, fmt.Errorf("get %s: decode: %w", path, err)
	}
	return d.Metadata.Annotations[AllowAnnotation] == "true", nil
}

// Write prints the report for an operator.
func (r Report) Write(w io.Writer) {
	if !r.InUse() {
		fmt.Fprintf(w, "no PersistentVolume or VolumeAttachment of %s is left\n", r.Driver)
		return
	}
	fmt.Fprintf(w, "%d PersistentVolumes and %d VolumeAttachments of %s are left:\n", len(r.Volumes), len(r.Attachments), r.Driver)
	for _, v := range r.Volumes {
		fmt.Fprintf(w, "  pv %s  claim %s  phase %s  node %s  reclaim %s\n", v.Name, dash(v.Claim), dash(v.Phase), dash(v.Node), dash(v.ReclaimPolicy))
	}
	for _, a := range r.Attachments {
		fmt.Fprintf(w, "  volumeattachment %s  pv %s  node %s  attached %t\n", a.Name, dash(a.Volume), dash(a.Node), a.Attached)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// The parts of the API objects Check reads.
type (
	objectMeta struct {
		Name string `json:"name"`
	}
	persistentVolume struct {
		Metadata objectMeta `json:"metadata"`
		Spec     struct {
			CSI *struct {
				Driver string `json:"driver"`
			} `json:"csi"`
			ClaimRef *struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"claimRef"`
			ReclaimPolicy string `json:"persistentVolumeReclaimPolicy"`
			NodeAffinity  *struct {
				Required *struct {
					NodeSelectorTerms []struct {
						MatchExpressions []struct {
							Key    string   `json:"key"`
							Values []string `json:"values"`
						} `json:"matchExpressions"`
					} `json:"nodeSelectorTerms"`
				} `json:"required"`
			} `json:"nodeAffinity"`
		} `json:"spec"`
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	}
	volumeAttachment struct {
		Metadata objectMeta `json:"metadata"`
		Spec     struct {
			Attacher string `json:"attacher"`
			NodeName string `json:"nodeName"`
			Source   struct {
				PersistentVolumeName string `json:"persistentVolumeName"`
			} `json:"source"`
		} `json:"spec"`
		Status struct {
			Attached bool `json:"attached"`
		} `json:"status"`
	}
)

// node is the node the volume lives on, from its node affinity.
func (pv persistentVolume) node() string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == topologyKey && len(e.Values) > 0 {
				return e.Values[0]
			}
		}
	}
	return ""
}
