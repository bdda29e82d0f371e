package peer

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// PodResolver finds peers through the API server: the running pods of the
// installation (its label selector, in its namespace), by the node they
// run on. It watches those pods (one watch, kept by an informer) and
// answers from what the watch brought, so a call asks the API server
// nothing. Only the pods' addresses come from the API; who answers there
// is proved by TLS and the peer's token.
type PodResolver struct {
	namespace, selector string
	port                int
	tag                 func(node string) string // the tag of a node in volume IDs
	informer            cache.SharedIndexInformer
	pods                corelisters.PodNamespaceLister
}

// NewPodResolver returns the resolver of the plugin pods selector selects
// in namespace, whose peer channel listens on port; tag gives a node's
// tag. It resolves nothing until Start.
func NewPodResolver(api dynamic.Interface, namespace, selector string, port int, tag func(node string) string) *PodResolver {
	inf := kubeapi.NewInformer[corev1.Pod](api, kubeapi.Pods, namespace, selector)
	return &PodResolver{namespace: namespace, selector: selector, port: port, tag: tag, informer: inf,
		pods: corelisters.NewPodLister(inf.GetIndexer()).Pods(namespace)}
}

// Start starts the watch and waits until it has listed the pods once; the
// watch runs until ctx ends. Its error is only ctx's.
func (r *PodResolver) Start(ctx context.Context) error {
	go r.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced) {
		return fmt.Errorf("watch the plugin pods in namespace %s: %w", r.namespace, ctx.Err())
	}
	return nil
}

// Pod returns the installation's pod name as the watch last saw it (nil
// when it has not seen it).
func (r *PodResolver) Pod(name string) *corev1.Pod {
	p, err := r.pods.Get(name)
	if err != nil {
		return nil
	}
	return p
}

// Resolve returns the plugin pod of the node tagged tag. A pod on its way
// out is taken only when no other runs there. A tag is a node's name, or
// for a long name a hash of it (pkg/driver's nodeTag) that two nodes may
// share: then the tag does not say which of them holds the object, and
// Resolve refuses to guess (FailedPrecondition naming both) rather than
// send a forwarded call, or take a pull's data, from the first found.
func (r *PodResolver) Resolve(ctx context.Context, tag string) (Peer, error) {
	pods, err := r.pods.List(labels.Everything())
	if err != nil {
		return Peer{}, err
	}
	type candidate struct {
		Peer
		leaving bool
	}
	byNode := map[string]candidate{}
	for _, p := range pods {
		node := p.Spec.NodeName
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || node == "" || r.tag(node) != tag {
			continue
		}
		leaving := p.DeletionTimestamp != nil
		if c, ok := byNode[node]; !ok || (c.leaving && !leaving) {
			byNode[node] = candidate{Peer{Node: node, Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(r.port))}, leaving}
		}
	}
	switch len(byNode) {
	case 0:
		return Peer{}, fmt.Errorf("no running plugin pod (%s in namespace %s) on the node tagged %s", r.selector, r.namespace, tag)
	case 1:
		for _, c := range byNode {
			return c.Peer, nil
		}
	}
	nodes := slices.Sorted(maps.Keys(byNode))
	return Peer{}, status.Errorf(codes.FailedPrecondition, "nodes %s all have the tag %s (a hash of their long names): the tag does not say which holds the object, so none is asked; rename one of the nodes",
		strings.Join(nodes, ", "), tag)
}
