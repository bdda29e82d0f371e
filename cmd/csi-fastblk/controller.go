package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/nodeloss"
)

// controllerConfig is the flags of `csi-fastblk controller`.
type controllerConfig struct {
	endpoint, driverName, nodeID string
	expansion, release           bool
	peerPort                     int
	peer                         peerConfig
}

// releaseInterval is how often the controller looks for bound PVs whose
// node has no Node object (a look at its watches' caches).
const releaseInterval = 10 * time.Second

// controllerFlags declares the flags of `csi-fastblk controller` but
// klog's.
func controllerFlags(fs *flag.FlagSet) *controllerConfig {
	c := &controllerConfig{}
	fs.StringVar(&c.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint of the external-resizer: unix:///path or tcp://host:port")
	fs.StringVar(&c.driverName, "driver-name", "fastblk.csi.io", "CSI driver name")
	fs.StringVar(&c.nodeID, "node-id", "", "the node this pod runs on, which its peer token names")
	fs.BoolVar(&c.expansion, "controller-expansion", false, "advertise ControllerExpandVolume, forwarded to the volume's node")
	fs.BoolVar(&c.release, "release-claims-of-deleted-nodes", false,
		"release the claims of volumes whose node has no Node object any more, where neither the claim nor its StorageClass says otherwise (annotation "+nodeloss.AnnRelease+")")
	fs.IntVar(&c.peerPort, "peer-port", 9815, "the plugins' peer channel port")
	peerClientFlags(fs, &c.peer)
	return c
}

// runController runs the controller Deployment's plugin: the CSI service
// of the external-resizer beside it, which forwards each volume's change
// to its node over the peer channel (driver.Relay), and the release of
// the claims of deleted nodes (pkg/nodeloss). It serves no volume and
// needs no privilege.
func runController(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	c := controllerFlags(fs)
	klog.InitFlags(fs) // -v and klog's other flags, as serve's
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("controller: unexpected arguments %q", fs.Args())
	}
	defer klog.Flush()
	usePeers := c.peer.secret != ""
	if usePeers {
		if err := c.peer.checkClient(); err != nil {
			return err
		}
		if c.nodeID == "" {
			return errors.New("--node-id is required with the peer channel: the controller's token names its node")
		}
	}
	api, err := kubeapi.InCluster("controller")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fwd driver.Forwarder
	if usePeers {
		ch := &peerChannel{}
		fwd = ch
		go func() {
			p, err := dialPeers(ctx, c.peer, api, c.nodeID, c.peerPort)
			if err != nil {
				klog.ErrorS(err, "peer channel: exiting so that the container restarts")
				cancel()
				return
			}
			if p != nil {
				ch.client.Store(p.client)
			}
		}()
	}
	r := &nodeloss.Releaser{API: api, Driver: c.driverName, TopologyKey: driver.TopologyKey, Default: c.release, Interval: releaseInterval}
	go r.Run(ctx)
	lis, err := driver.Listen(c.endpoint)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	klog.InfoS("controller serving", "endpoint", c.endpoint, "driver", c.driverName, "node", c.nodeID, "peers", usePeers,
		"releaseClaimsOfDeletedNodes", c.release)
	err = driver.NewRelay(c.driverName, version, c.expansion, fwd).Serve(ctx, lis)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
