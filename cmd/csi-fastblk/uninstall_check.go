package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/fastblk/csi-fastblk/pkg/uninstall"
)

// errInUse is what uninstall-check returns when the driver still has
// volumes: the chart's pre-delete hook fails, and so does helm uninstall.
var errInUse = errors.New("volumes of the driver are left: delete their PVCs first (a PV whose reclaim policy is Retain needs deleting too), or set uninstallCheck.allowWithVolumes=true to remove the driver anyway (see docs/upgrades.md)")

// runUninstallCheck lists the driver's PersistentVolumes and
// VolumeAttachments from inside a pod (the chart's pre-delete hook) and
// fails while any exist, unless --allow-volumes.
func runUninstallCheck(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("uninstall-check", flag.ContinueOnError)
	driverName := fs.String("driver-name", "fastblk.csi.io", "CSI driver name")
	allow := fs.Bool("allow-volumes", false, "report the volumes left but succeed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("uninstall-check: unexpected arguments %q", fs.Args())
	}
	c, err := uninstall.InCluster()
	if err != nil {
		return fmt.Errorf("uninstall-check: %w", err)
	}
	r, err := uninstall.Check(ctx, c, *driverName)
	if err != nil {
		return fmt.Errorf("uninstall-check: %w", err)
	}
	r.Write(os.Stdout)
	switch {
	case !r.InUse():
		return nil
	case *allow:
		fmt.Println("allowed (--allow-volumes): the driver is removed with them; their data stays in each node's data directory")
		return nil
	}
	return errInUse
}
