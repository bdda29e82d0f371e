//go:build snapshotlister

// Command snapshot-metadata-lister is the backup application of the
// changed-block-tracking test (test/k8s, issue 42): it lists a
// VolumeSnapshot's allocated blocks, or the blocks changed since an earlier
// VolumeSnapshot of the same volume, as JSON on stdout.
//
// Everything a backup application does is the upstream client library's
// (github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator at the
// sidecar's tag): it finds the driver's SnapshotMetadataService object, asks
// the API server for a token of the pod's service account with that
// object's audience, dials its address with its CA bundle and streams
// GetMetadataAllocated or GetMetadataDelta. This file only parses flags with
// the names of the module's own tools/snapshot-metadata-lister, which is a
// separate Go module without a release tag of its own and so cannot be
// fetched as a module here. hack/k8s/install.sh copies this file into its
// wrapper module of external-snapshot-metadata and builds it there; the
// build tag keeps it out of csi-fastblk's module, which does not require
// that module.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator"
	"k8s.io/client-go/rest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "snapshot-metadata-lister:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		args       iterator.Args
		maxResults int
		output     string
	)
	flag.StringVar(&args.Namespace, "n", "", "namespace of the VolumeSnapshots")
	flag.StringVar(&args.SnapshotName, "s", "", "the VolumeSnapshot whose blocks to list")
	flag.StringVar(&args.PrevSnapshotName, "p", "", "an earlier VolumeSnapshot of the same volume: list the blocks changed since it")
	flag.StringVar(&args.PrevSnapshotID, "P", "", "the CSI handle of an earlier snapshot (instead of -p)")
	flag.Int64Var(&args.StartingOffset, "starting-offset", 0, "first byte offset to list")
	flag.IntVar(&maxResults, "max-results", 0, "most ranges per streamed message (0: the driver's choice)")
	flag.StringVar(&output, "o", "json", "output format: json or table")
	flag.Parse()
	args.MaxResults = int32(maxResults)
	switch output {
	case "json":
		args.Emitter = &iterator.JSONEmitter{Writer: os.Stdout}
	case "table":
		args.Emitter = &iterator.TableEmitter{Writer: os.Stdout}
	default:
		return fmt.Errorf("output format %q: want json or table", output)
	}

	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster config: %w", err)
	}
	if args.Clients, err = iterator.BuildClients(cfg); err != nil {
		return fmt.Errorf("clients: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := iterator.GetSnapshotMetadata(ctx, args); err != nil {
		return fmt.Errorf("snapshot metadata of %s/%s: %w", args.Namespace, args.SnapshotName, err)
	}
	fmt.Println()
	return nil
}
