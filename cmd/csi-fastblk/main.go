// Command csi-fastblk is the csi-fastblk CSI plugin and its operator tools.
//
//	csi-fastblk serve     run the plugin (Identity, Controller and Node on one socket)
//	csi-fastblk status    show a node's volumes, devices and I/O from the running plugin
//	csi-fastblk bench     benchmarks (the io_uring engine)
//	csi-fastblk ublk      ublk device tools (serve a file as a device, list, features)
//	csi-fastblk uninstall-check  fail while the driver has volumes (the chart's pre-delete hook)
//	csi-fastblk peer-ca          make the peer channel's CA Secret (the chart's post-install and pre-upgrade hook)
//	csi-fastblk version   print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "csi-fastblk:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		usage()
		return errors.New("missing command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest)
	case "status":
		return runStatus(ctx, rest)
	case "bench":
		return runBench(ctx, rest)
	case "ublk":
		return runUblk(ctx, rest)
	case "uninstall-check":
		return runUninstallCheck(ctx, rest)
	case "peer-ca":
		return runPeerCA(ctx, rest)
	case "version", "--version":
		fmt.Println(version)
		return nil
	case "help", "-h", "--help":
		usage()
		return nil
	}
	usage()
	return fmt.Errorf("unknown command %q", cmd)
}

func usage() { fmt.Fprint(os.Stderr, usageText) }

// usageText lists the commands (docs/configuration.md has their flags).
const usageText = `usage: csi-fastblk <command> [flags]

commands:
  serve     run the CSI plugin
  status    show the node's volumes, devices and I/O (from a running plugin)
  bench     run a benchmark (bench engine|scale)
  ublk      ublk device tools (ublk serve|list|features)
  uninstall-check  fail while the driver has volumes (run in a pod)
  peer-ca          make the peer channel's CA Secret unless it exists (run in a pod)
  version   print the version
`
