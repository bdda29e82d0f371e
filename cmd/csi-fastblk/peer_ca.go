package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// runPeerCA makes the peer channel's CA Secret unless it exists (the
// chart's post-install and pre-upgrade Job, with an account of its own:
// the plugins may only read the Secret). The CA serves the channel's
// transport; which node a peer is, its token proves (docs/peer.md).
func runPeerCA(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("peer-ca", flag.ContinueOnError)
	namespace, secret, selector := peerCAFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *namespace == "" || *secret == "" {
		return fmt.Errorf("peer-ca: want --namespace and --secret and no arguments")
	}
	var labels map[string]string
	if *selector != "" {
		l, err := selectorLabels(*selector)
		if err != nil {
			return fmt.Errorf("peer-ca: --labels: %w", err)
		}
		labels = l
	}
	api, err := kubeapi.InCluster("peer-ca")
	if err != nil {
		return fmt.Errorf("peer-ca: %w", err)
	}
	ca, err := peer.EnsureCA(ctx, api, *namespace, *secret, labels)
	if err != nil {
		return fmt.Errorf("peer-ca: %w", err)
	}
	fmt.Printf("peer CA %s/%s: %s, valid until %s\n", *namespace, *secret, ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format("2006-01-02"))
	return nil
}

// peerCAFlags declares the flags of `csi-fastblk peer-ca`.
func peerCAFlags(fs *flag.FlagSet) (namespace, secret, labels *string) {
	namespace = fs.String("namespace", "", "the installation's namespace")
	secret = fs.String("secret", "", "the CA Secret's name (the plugins' --peer-ca-secret)")
	labels = fs.String("labels", "", "labels of the Secret, k=v,...")
	return namespace, secret, labels
}
