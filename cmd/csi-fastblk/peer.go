package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// peerConfig is the peer channel's part of serve's flags.
type peerConfig struct {
	address        string // listen address; empty: no peer channel
	namespace      string
	serviceAccount string
	secret         string
	selector       string
	tokenFile      string // the projected token that proves this plugin's node
	audience       string // its audience, the peer channel's
	// The controller's account and pod labels, whose calls this plugin
	// serves (and no other's changes of volumes).
	controllerSA, controllerSelector string
	// What peers may hold of this plugin (peer.Limits).
	maxStreams, maxStreamsPerPeer int
	minRate                       string
	serveData                     bool
	serveMetadata                 bool
	limits                        peer.Limits // from the above, by check
	// What handoffs of one peer may make here before their PVs come.
	maxHandoffs     int
	maxHandoffBytes string
	handoffReap     time.Duration
	handoffs        driver.HandoffLimits // from the above, by check
}

func peerFlags(fs *flag.FlagSet, c *peerConfig) {
	fs.StringVar(&c.address, "peer-address", "",
		"address of the peer channel (mutual TLS between the plugins of one installation; docs/peer.md), e.g. :9815; "+
			"other nodes' plugins reach this one at its pod address and this port (empty: off, and controller calls for other nodes' volumes are refused)")
	peerClientFlags(fs, c)
	fs.StringVar(&c.controllerSA, "peer-controller-service-account", "",
		"the controller's service account: only its pod (--peer-controller-selector) may change and grow this node's volumes over the channel, and it may do nothing else (empty: any plugin may)")
	fs.StringVar(&c.controllerSelector, "peer-controller-selector", "", "label selector of the controller's pod, k=v,...")
	d := peer.DefaultLimits
	fs.IntVar(&c.maxStreams, "peer-max-streams", d.MaxStreams,
		"the most data streams (restores and clones on other nodes) this plugin sends at once; beyond it a peer's stream is refused (ResourceExhausted) and retried")
	fs.IntVar(&c.maxStreamsPerPeer, "peer-max-streams-per-peer", d.MaxStreamsPerPeer, "the most data streams this plugin sends at once to one node")
	fs.StringVar(&c.minRate, "peer-min-rate", "1Mi",
		"the least rate of a data stream, bytes per second (Ki, Mi, Gi, k, M, G): a class's transferRate below it is raised to it, and a stream ends after its source's size at this rate and 2 minutes")
	fs.BoolVar(&c.serveMetadata, "peer-serve-metadata", false,
		"answer the snapshot metadata calls other nodes' plugins forward for this node's snapshots (the chart sets it with snapshotMetadata.enabled); false refuses them (PermissionDenied)")
	h := driver.DefaultHandoffLimits
	fs.IntVar(&c.maxHandoffs, "peer-max-handoffs-per-peer", h.PerPeer,
		"the most volumes handoffs of one node may have made on this node whose PVs have not come yet; beyond it a handoff is refused (Unavailable) and retried")
	fs.StringVar(&c.maxHandoffBytes, "peer-max-handoff-bytes-per-peer", "1024Gi",
		"the most bytes those volumes of one node may hold together (Ki, Mi, Gi, k, M, G); a handoff for a node that has none waiting is never refused by it")
	fs.DurationVar(&c.handoffReap, "peer-handoff-reap-after", h.ReapAfter,
		"how long a volume a handoff made on this node may wait for its PV; after it, the volume is removed")
	fs.BoolVar(&c.serveData, "peer-serve-data", true,
		"send snapshots' and volumes' data to other nodes' plugins for restores and clones; false refuses them (PermissionDenied) and pulls none, so such a claim is pinned to its source's node; set it alike on every node")
}

// peerClientFlags are the flags of what a peer channel's client needs:
// the plugin's and the controller's.
func peerClientFlags(fs *flag.FlagSet, c *peerConfig) {
	fs.StringVar(&c.namespace, "peer-namespace", "", "the installation's namespace (default: the pod's, from its service account)")
	fs.StringVar(&c.serviceAccount, "peer-service-account", "", "the plugin's service account, which every peer's certificate must name")
	fs.StringVar(&c.secret, "peer-ca-secret", "", "the Secret (in --peer-namespace, of type "+peer.SecretType+") that holds the peer CA of the channel's transport; the chart's peer-ca Job makes it")
	fs.StringVar(&c.tokenFile, "peer-token-file", "",
		"the pod's projected service account token for --peer-token-audience, which proves to peers the node this plugin runs on (read afresh for every call)")
	fs.StringVar(&c.audience, "peer-token-audience", "", "the audience of the peers' tokens, the installation's own")
	fs.StringVar(&c.selector, "peer-selector", "", "label selector of the installation's plugin pods, k=v,... (the peers)")
}

// peerChannel is the driver's Forwarder until the channel is up: calls
// are Unavailable (the external-resizer retries them) while the plugin
// still waits for the API server to give it the CA.
type peerChannel struct {
	client atomic.Pointer[peer.Client]
}

var errPeerNotReady = status.Error(codes.Unavailable, "the peer channel is not up yet (waiting for the peer CA from the API server)")

func (p *peerChannel) ModifyVolume(ctx context.Context, tag string, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	c := p.client.Load()
	if c == nil {
		return nil, errPeerNotReady
	}
	return c.ModifyVolume(ctx, tag, req)
}

func (p *peerChannel) ExpandVolume(ctx context.Context, tag string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	c := p.client.Load()
	if c == nil {
		return nil, errPeerNotReady
	}
	return c.ExpandVolume(ctx, tag, req)
}

func (p *peerChannel) CreateVolume(ctx context.Context, tag string, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	c := p.client.Load()
	if c == nil {
		return nil, errPeerNotReady
	}
	return c.CreateVolume(ctx, tag, req)
}

func (p *peerChannel) ReadData(ctx context.Context, tag string, req *peer.ReadRequest, sink peer.Sink, idle time.Duration) (peer.Received, error) {
	c := p.client.Load()
	if c == nil {
		return peer.Received{}, errPeerNotReady
	}
	return c.ReadData(ctx, tag, req, sink, idle)
}

// check validates the flags and fills the namespace from the pod's.
func (c *peerConfig) check() error {
	if c.address == "" {
		return nil
	}
	if err := c.checkClient(); err != nil {
		return err
	}
	if (c.controllerSA == "") != (c.controllerSelector == "") {
		return fmt.Errorf("--peer-controller-service-account and --peer-controller-selector go together")
	}
	if c.controllerSelector != "" {
		if _, err := selectorLabels(c.controllerSelector); err != nil {
			return err
		}
	}
	rate, err := driver.ParseBandwidth(c.minRate)
	if err != nil || rate <= 0 {
		return fmt.Errorf("--peer-min-rate %q: want a positive number of bytes per second (e.g. 1Mi)", c.minRate)
	}
	if c.maxStreams <= 0 || c.maxStreamsPerPeer <= 0 {
		return fmt.Errorf("--peer-max-streams (%d) and --peer-max-streams-per-peer (%d) must be positive", c.maxStreams, c.maxStreamsPerPeer)
	}
	c.limits = peer.Limits{MaxStreams: c.maxStreams, MaxStreamsPerPeer: c.maxStreamsPerPeer, MinRate: rate, RefuseData: !c.serveData}
	bytes, err := driver.ParseBytes(c.maxHandoffBytes)
	if err != nil || bytes <= 0 || c.maxHandoffs <= 0 || c.handoffReap <= 0 {
		return fmt.Errorf("--peer-max-handoffs-per-peer (%d), --peer-max-handoff-bytes-per-peer (%q) and --peer-handoff-reap-after (%v) must be positive",
			c.maxHandoffs, c.maxHandoffBytes, c.handoffReap)
	}
	c.handoffs = driver.HandoffLimits{PerPeer: c.maxHandoffs, BytesPerPeer: bytes, ReapAfter: c.handoffReap}
	return nil
}

// checkClient validates the flags of peerClientFlags and fills the
// namespace from the pod's.
func (c *peerConfig) checkClient() error {
	if c.namespace == "" {
		b, err := os.ReadFile(filepath.Join(kubeapi.ServiceAccountDir, "namespace"))
		if err != nil {
			return fmt.Errorf("--peer-namespace is empty and the pod's namespace is unknown: %w", err)
		}
		c.namespace = strings.TrimSpace(string(b))
	}
	if c.serviceAccount == "" || c.secret == "" || c.selector == "" || c.tokenFile == "" || c.audience == "" {
		return fmt.Errorf("the peer channel needs --peer-service-account, --peer-ca-secret, --peer-selector, --peer-token-file and --peer-token-audience")
	}
	_, err := selectorLabels(c.selector)
	return err
}

// selectorLabels reads an equality-only label selector as labels: a
// peer's pod must have them.
func selectorLabels(sel string) (map[string]string, error) {
	l := map[string]string{}
	for _, kv := range strings.Split(sel, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k+v, "!=() ") {
			return nil, fmt.Errorf("--peer-selector %q: want k=v,... (equality only)", sel)
		}
		l[k] = v
	}
	return l, nil
}

// runPeer brings the peer channel up (it retries the API server until it
// gives the CA) and serves it until ctx ends; ch forwards through it once
// it is up. Every call is authenticated by the peers' tokens (pkg/peer's
// Tokens) and authorized by the API server's objects (the driver's
// PeerAuthz, set by newPeerAuthz).
func runPeer(ctx context.Context, c peerConfig, api dynamic.Interface, nodeID string, drv *driver.Driver, ch *peerChannel) error {
	lis, err := net.Listen("tcp", c.address)
	if err != nil {
		return fmt.Errorf("peer channel: listen: %w", err)
	}
	defer lis.Close()
	_, portStr, _ := net.SplitHostPort(lis.Addr().String())
	port, _ := strconv.Atoi(portStr)
	p, err := dialPeers(ctx, c, api, nodeID, port)
	if p == nil {
		return err
	}
	if c.controllerSA != "" {
		p.tokens.Auth.Controller = c.controllerSA
		p.tokens.Auth.ControllerLabels, _ = selectorLabels(c.controllerSelector)
	}
	ch.client.Store(p.client)
	klog.InfoS("peer channel up", "address", c.address, "identity", p.creds.Self(), "audience", c.audience, "controller", c.controllerSA, "limits", c.limits)
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(driver.LogAndRecover)}, p.tokens.ServerOptions()...)
	return peer.NewServerWith(p.creds, drv.PeerService(), c.limits, opts...).Serve(ctx, lis)
}

// peers is a peer channel's client side: its transport credentials, its
// tokens and the client that reaches the plugins.
type peers struct {
	creds  *peer.Credentials
	tokens *peer.Tokens
	client *peer.Client
}

// dialPeers makes the client side of the peer channel of the plugins that
// serve it on port, as node nodeID: it waits for the CA (nil, nil when ctx
// ends first) and the first list of the plugin pods.
func dialPeers(ctx context.Context, c peerConfig, api dynamic.Interface, nodeID string, port int) (*peers, error) {
	labels, _ := selectorLabels(c.selector)
	// Peers decide how many TokenReviews there are: they go through a
	// client with a rate limit of its own.
	reviews, err := kubeapi.InClusterWithLimit("plugin-peer-reviews", peer.ReviewQPS, peer.ReviewBurst)
	if err != nil {
		return nil, fmt.Errorf("peer channel: %w", err)
	}
	var ca *peer.CA
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		ca, err = peer.ReadCA(ctx, api, c.namespace, c.secret)
		if err == nil {
			break
		}
		klog.ErrorS(err, "peer channel: no CA yet (the chart's peer-ca Job makes it); retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
	}
	// The certificate says only "of the installation" (its CA is on every
	// node); the token says who the caller is.
	creds, err := peer.NewCredentials(ca, peer.Identity{Namespace: c.namespace, ServiceAccount: c.serviceAccount, Node: nodeID}, nil)
	if err != nil {
		return nil, fmt.Errorf("peer channel: %w", err)
	}
	res := peer.NewPodResolver(api, c.namespace, c.selector, port, driver.NodeTag)
	if err := res.Start(ctx); err != nil {
		return nil, nil // only ctx's end stops the first list
	}
	tok := &peer.Tokens{Self: peer.TokenFile(c.tokenFile), Node: nodeID, Auth: &peer.Authenticator{
		API: api, Reviews: reviews, Pods: res.Pod, Namespace: c.namespace, ServiceAccount: c.serviceAccount, Audience: c.audience, Labels: labels}}
	if _, err := tok.Self(); err != nil {
		return nil, fmt.Errorf("peer channel: %w", err)
	}
	klog.InfoS("peer channel: client ready", "ca", ca.Cert.Subject.CommonName, "node", nodeID)
	return &peers{creds: creds, tokens: tok, client: peer.NewClient(creds, res).WithTokens(tok)}, nil
}

// newPeerAuthz is the driver's authorizer of peers' calls.
func newPeerAuthz(api dynamic.Interface, driverName string) driver.PeerAuthorizer {
	return &driver.APIAuthorizer{API: api, Driver: driverName}
}
