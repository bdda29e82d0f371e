package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
	"github.com/fastblk/csi-fastblk/pkg/uninstall"
)

// errInUse is what uninstall-check returns when the driver still has
// volumes: the chart's pre-delete hook fails, and so does helm uninstall.
var errInUse = errors.New("volumes of the driver are left (see above); helm uninstall is refused")

// runUninstallCheck lists the driver's PersistentVolumes and
// VolumeAttachments from inside a pod (the chart's pre-delete hook) and
// fails while any exist, unless --allow-volumes or the CSIDriver's
// uninstall.AllowAnnotation allows it.
func runUninstallCheck(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("uninstall-check", flag.ContinueOnError)
	driverName, allow, rel := uninstallCheckFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("uninstall-check: unexpected arguments %q", fs.Args())
	}
	c, err := kubeapi.InCluster("uninstall-check")
	if err != nil {
		return fmt.Errorf("uninstall-check: %w", err)
	}
	r, err := uninstall.Check(ctx, c, *driverName)
	if err != nil {
		return fmt.Errorf("uninstall-check: %w", err)
	}
	r.Write(os.Stdout)
	if !r.InUse() {
		return nil
	}
	if *allow {
		fmt.Println("allowed (uninstallCheck.allowWithVolumes): the driver is removed with them; their data stays in each node's data directory")
		return nil
	}
	annotated, err := uninstall.Allowed(ctx, c, *driverName)
	if err != nil {
		return fmt.Errorf("uninstall-check: %w", err)
	}
	if annotated {
		fmt.Printf("allowed (CSIDriver %s has %s=true): the driver is removed with them; their data stays in each node's data directory\n", *driverName, uninstall.AllowAnnotation)
		return nil
	}
	rel.explain(os.Stdout, *driverName)
	return errInUse
}

// uninstallCheckFlags declares the flags of `csi-fastblk uninstall-check`.
func uninstallCheckFlags(fs *flag.FlagSet) (driverName *string, allow *bool, rel *release) {
	driverName = fs.String("driver-name", "fastblk.csi.io", "CSI driver name")
	allow = fs.Bool("allow-volumes", false, "report the volumes left but succeed")
	rel = &release{}
	fs.StringVar(&rel.name, "release", "csi-fastblk", "Helm release name (for the commands the refusal prints)")
	fs.StringVar(&rel.namespace, "release-namespace", "csi-fastblk", "Helm release namespace (for the commands the refusal prints)")
	fs.IntVar(&rel.revision, "release-revision", 0, "Helm release revision being uninstalled (for the helm rollback the refusal prints)")
	return driverName, allow, rel
}

// release names the Helm release being uninstalled.
type release struct {
	name, namespace string
	revision        int
}

// explain says what a refused uninstall leaves and the ways on from it.
// Helm records a release whose pre-delete hook failed as "uninstalling",
// and helm upgrade refuses such a release, so a chart value cannot be the
// way out until helm rollback.
func (r release) explain(w io.Writer, driver string) {
	rev := "REVISION"
	if r.revision > 0 {
		rev = fmt.Sprint(r.revision)
	}
	fmt.Fprintf(w, `
Nothing was removed: the plugin still serves these volumes. Either
  - delete their PVCs (and any PV whose reclaim policy is Retain), then run helm uninstall again;
  - or remove the driver anyway, leaving their data in each node's data directory (docs/upgrades.md):
      kubectl annotate csidriver %s %s=true
      helm uninstall %s -n %s
  - or keep the driver: Helm now lists the release as "uninstalling" and refuses helm upgrade until
      helm rollback %s %s -n %s
`, driver, uninstall.AllowAnnotation, r.name, r.namespace, r.name, rev, r.namespace)
}
