package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

// classFlags are the --device-class flags, one class each.
type classFlags []devclass.Class

func (c *classFlags) String() string {
	var s []string
	for _, cl := range *c {
		s = append(s, cl.Name+"="+cl.Path)
	}
	return strings.Join(s, " ")
}

func (c *classFlags) Set(v string) error {
	cl, err := parseClass(v)
	if err != nil {
		return err
	}
	for _, have := range *c {
		if have.Name == cl.Name {
			return fmt.Errorf("device class %s is given twice", cl.Name)
		}
	}
	*c = append(*c, cl)
	return nil
}

// parseClass reads one --device-class: name=NAME,path=PATH and optionally
// reserve=SIZE|N% and over-provision-ratio=R, comma-separated.
func parseClass(v string) (devclass.Class, error) {
	c := devclass.Class{OverProvisionRatio: 1}
	bad := func(format string, args ...any) (devclass.Class, error) {
		return devclass.Class{}, fmt.Errorf("--device-class %q: %s (want name=NAME,path=PATH[,reserve=SIZE|N%%][,over-provision-ratio=R])",
			v, fmt.Sprintf(format, args...))
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || val == "" {
			return bad("%q is not key=value", kv)
		}
		if seen[k] {
			return bad("%s is given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "name":
			c.Name = val
			err = devclass.CheckName(val)
		case "path":
			c.Path = val
		case "reserve":
			c.ReserveBytes, c.ReserveRatio, err = driver.ParseReserve(val)
		case "over-provision-ratio":
			c.OverProvisionRatio, err = strconv.ParseFloat(val, 64)
			if err == nil && !(c.OverProvisionRatio >= 1 && c.OverProvisionRatio <= 100) {
				err = errors.New("want a ratio from 1 to 100")
			}
		default:
			return bad("unknown key %q", k)
		}
		if err != nil {
			return bad("%s: %v", k, err)
		}
	}
	if c.Name == "" || c.Path == "" {
		return bad("name and path are required")
	}
	if c.Name == devclass.Default {
		return bad("%q is the data directory's class (--data-dir, --reserve, --over-provision-ratio)", devclass.Default)
	}
	return c, nil
}

// openClass is a configured class whose store opened.
type openClass struct {
	name string
	st   *store.Store
}

// downClass is a class the node cannot serve, and why.
type downClass struct {
	name, path string
	volumes    []string // store IDs found in its directory
	why        error
}

// openClasses opens the store of each configured class whose directory
// passes its checks (devclass.Check and Claim), and lists as down the
// others and the classes the node served before (devclass.Seen) that are
// no longer configured but still hold volumes, or whose path changed
// while the old one holds volumes. It records the classes served from now
// on. Only an unreadable default directory is fatal: a class's trouble is
// that class's, and the node serves the rest.
func openClasses(defaultDir string, configured []devclass.Class, rootRefs []string) ([]openClass, []downClass, error) {
	if who, err := devclass.Owner(defaultDir); err != nil || who != "" {
		return nil, nil, fmt.Errorf("data directory %s is device class %s's directory (%v): give --data-dir a directory of its own", defaultDir, who, err)
	}
	seen, err := devclass.Seen(defaultDir)
	if err != nil {
		klog.ErrorS(err, "the device classes served before are unknown: a class removed since is not reported")
		seen = map[string]string{}
	}
	var open []openClass
	var down []downClass
	isDown := func(c devclass.Class, why error) {
		vols, _ := devclass.Volumes(c.Path)
		down = append(down, downClass{name: c.Name, path: c.Path, volumes: vols, why: why})
	}
	isConfigured := map[string]bool{}
	for _, c := range configured {
		isConfigured[c.Name] = true
		if old, ok := seen[c.Name]; ok && old != c.Path {
			if vols, _ := devclass.Volumes(old); len(vols) > 0 {
				isDown(devclass.Class{Name: c.Name, Path: old}, fmt.Errorf("its path changed from %s, which still holds %d of its volumes, to %s: "+
					"move them there (volumes/, snapshots/, meta/, changes/ and the device-class marker), or set the path back", old, len(vols), c.Path))
				continue
			}
		}
		err := devclass.Check(c, defaultDir, configured, rootRefs)
		if err == nil {
			err = devclass.Claim(c.Path, c.Name)
		}
		var st *store.Store
		if err == nil {
			st, err = store.Open(store.Config{Dir: c.Path, OverProvisionRatio: c.OverProvisionRatio,
				ReserveBytes: c.ReserveBytes, ReserveRatio: c.ReserveRatio})
		}
		if err != nil {
			isDown(c, err)
			continue
		}
		seen[c.Name] = c.Path
		open = append(open, openClass{name: c.Name, st: st})
	}
	for name, path := range seen {
		if isConfigured[name] {
			continue
		}
		vols, err := devclass.Volumes(path)
		if err == nil && len(vols) == 0 {
			klog.InfoS("device class removed from the configuration; it held no volumes", "deviceClass", name, "path", path)
			delete(seen, name)
			continue
		}
		why := fmt.Errorf("removed from the configuration while %d of its volumes are in %s: configure it again to serve them", len(vols), path)
		if err != nil {
			why = fmt.Errorf("removed from the configuration, and its directory %s cannot be read (%w): configure it again to serve its volumes", path, err)
		}
		down = append(down, downClass{name: name, path: path, volumes: vols, why: why})
	}
	if err := devclass.Remember(defaultDir, seen); err != nil {
		klog.ErrorS(err, "cannot record the device classes served; a class removed later may go unreported")
	}
	return open, down, nil
}
