package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// PodResolver finds peers through the API server: the running pods of the
// installation (Selector, in Namespace), by the node they run on. Only
// the pods' addresses come from the API; who answers there is proved by
// TLS.
type PodResolver struct {
	API       *kubeapi.Client
	Namespace string
	Selector  string // label selector of the installation's plugin pods
	Port      int
	Tag       func(node string) string // the tag of a node in volume IDs
}

// pod is what Resolve reads of a pod.
type pod struct {
	Metadata struct {
		Name              string  `json:"name"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		PodIP string `json:"podIP"`
	} `json:"status"`
}

// Resolve returns the plugin pod of the node tagged tag. A pod on its way
// out is taken only when no other runs there.
func (r *PodResolver) Resolve(ctx context.Context, tag string) (Peer, error) {
	path := "/api/v1/namespaces/" + url.PathEscape(r.Namespace) + "/pods"
	q := url.Values{"labelSelector": {r.Selector}, "fieldSelector": {"status.phase=Running"}}
	var best Peer
	leaving := true
	err := r.API.List(ctx, path, q, func(raw json.RawMessage) error {
		var pods []pod
		if err := json.Unmarshal(raw, &pods); err != nil {
			return err
		}
		for _, p := range pods {
			if p.Status.PodIP == "" || p.Spec.NodeName == "" || r.Tag(p.Spec.NodeName) != tag {
				continue
			}
			if best.Addr == "" || (leaving && p.Metadata.DeletionTimestamp == nil) {
				best = Peer{Node: p.Spec.NodeName, Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(r.Port))}
				leaving = p.Metadata.DeletionTimestamp != nil
			}
		}
		return nil
	})
	if err != nil {
		return Peer{}, err
	}
	if best.Addr == "" {
		return Peer{}, fmt.Errorf("no running plugin pod (%s in namespace %s) on the node tagged %s", r.Selector, r.Namespace, tag)
	}
	return best, nil
}
