package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
// out is taken only when no other runs there. A tag is a node's name, or
// for a long name a hash of it (pkg/driver's nodeTag) that two nodes may
// share: then the tag does not say which of them holds the object, and
// Resolve refuses to guess (FailedPrecondition naming both) rather than
// send a forwarded call, or take a pull's data, from the first found.
func (r *PodResolver) Resolve(ctx context.Context, tag string) (Peer, error) {
	path := "/api/v1/namespaces/" + url.PathEscape(r.Namespace) + "/pods"
	q := url.Values{"labelSelector": {r.Selector}, "fieldSelector": {"status.phase=Running"}}
	type candidate struct {
		Peer
		leaving bool
	}
	byNode := map[string]candidate{}
	err := r.API.List(ctx, path, q, func(raw json.RawMessage) error {
		var pods []pod
		if err := json.Unmarshal(raw, &pods); err != nil {
			return err
		}
		for _, p := range pods {
			node := p.Spec.NodeName
			if p.Status.PodIP == "" || node == "" || r.Tag(node) != tag {
				continue
			}
			if c, ok := byNode[node]; !ok || (c.leaving && p.Metadata.DeletionTimestamp == nil) {
				byNode[node] = candidate{Peer{Node: node, Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(r.Port))}, p.Metadata.DeletionTimestamp != nil}
			}
		}
		return nil
	})
	if err != nil {
		return Peer{}, err
	}
	switch len(byNode) {
	case 0:
		return Peer{}, fmt.Errorf("no running plugin pod (%s in namespace %s) on the node tagged %s", r.Selector, r.Namespace, tag)
	case 1:
		for _, c := range byNode {
			return c.Peer, nil
		}
	}
	nodes := slices.Sorted(maps.Keys(byNode))
	return Peer{}, status.Errorf(codes.FailedPrecondition, "nodes %s all have the tag %s (a hash of their long names): the tag does not say which holds the object, so none is asked; rename one of the nodes",
		strings.Join(nodes, ", "), tag)
}
