package devclass

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// Default is the name of the default class, the plugin's data directory.
// A StorageClass without a class parameter, or naming this one, gets it.
const Default = "default"

// MaxNameLen is the longest class name: a class's name is part of its
// volumes' CSI IDs, which CSI bounds at 128 bytes.
const MaxNameLen = 32

// Class is one device class as configured.
type Class struct {
	Name string
	// Path is the class's data directory (volumes/, snapshots/, meta/
	// live below it, as in the default class's).
	Path string
	// ReserveBytes and ReserveRatio are the free space never handed
	// out (store.Config); OverProvisionRatio scales the free space
	// reported (1 = none).
	ReserveBytes       int64
	ReserveRatio       float64
	OverProvisionRatio float64
}

// Reserved reports whether the class keeps some of its filesystem back.
func (c Class) Reserved() bool { return c.ReserveBytes > 0 || c.ReserveRatio > 0 }

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// CheckName accepts a class name: 1 to MaxNameLen lowercase letters,
// digits and inner dashes (a DNS label, as Kubernetes names things).
func CheckName(name string) error {
	if len(name) > MaxNameLen || !nameRE.MatchString(name) {
		return fmt.Errorf("device class name %q: want 1 to %d lowercase letters, digits and inner dashes (e.g. nvme, fast-ssd): %w",
			name, MaxNameLen, blockdev.ErrInvalid)
	}
	return nil
}

// Check checks the directory of the named class c before its store opens
// it: it exists and is a directory (a class's path is never created, since
// a missing one is most often a disk not mounted, and volumes made there
// would land on the disk below); it neither is, holds nor lies in the
// default class's directory defaultDir or another class's (others); and
// when it is on the filesystem of one of rootRefs (the node's /, the
// kubelet's directory), the class has a reserve. Errors wrap
// blockdev.ErrInvalid, or blockdev.ErrNotFound for a missing path.
func Check(c Class, defaultDir string, others []Class, rootRefs []string) error {
	if err := CheckName(c.Name); err != nil {
		return err
	}
	if c.Name == Default {
		return fmt.Errorf("device class %q is the data directory (--data-dir), not a class of its own: %w", Default, blockdev.ErrInvalid)
	}
	if !filepath.IsAbs(c.Path) {
		return fmt.Errorf("device class %s: path %q is not absolute: %w", c.Name, c.Path, blockdev.ErrInvalid)
	}
	fi, err := os.Stat(c.Path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("device class %s: path %s does not exist (is its disk mounted there?); "+
			"a class's directory is not created, so that its volumes never land on the disk below it: %w", c.Name, c.Path, blockdev.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("device class %s: %w", c.Name, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("device class %s: path %s is not a directory: %w", c.Name, c.Path, blockdev.ErrInvalid)
	}
	real, err := resolve(c.Path)
	if err != nil {
		return fmt.Errorf("device class %s: %w", c.Name, err)
	}
	dirs := []Class{{Name: Default, Path: defaultDir}}
	for _, o := range others {
		if o.Name != c.Name {
			dirs = append(dirs, o)
		}
	}
	for _, o := range dirs {
		r, err := resolve(o.Path)
		if err != nil {
			continue // that class's own check says why
		}
		if within(real, r) || within(r, real) {
			return fmt.Errorf("device class %s: path %s overlaps device class %s's directory %s: each class needs a directory of its own: %w",
				c.Name, c.Path, o.Name, o.Path, blockdev.ErrInvalid)
		}
	}
	if c.Reserved() {
		return nil
	}
	for _, ref := range rootRefs {
		if same, err := sameFilesystem(real, ref); err == nil && same {
			return fmt.Errorf("device class %s: path %s is on the node's root filesystem (that of %s), where volumes would fill the disk "+
				"the kubelet, images and logs need: give the class a reserve (reserve=10%%, or bytes), or put it on a disk of its own: %w",
				c.Name, c.Path, ref, blockdev.ErrInvalid)
		}
	}
	return nil
}

// resolve is path made absolute with its symbolic links followed.
func resolve(path string) (string, error) {
	r, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(r)
}

// within reports whether path is dir or lies below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// sameFilesystem reports whether a and b are on one filesystem (one device
// number: bind mounts of a filesystem share it).
func sameFilesystem(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev, nil
}

// markerFile, in a named class's directory, holds the class's name.
const markerFile = "device-class"

// Claim makes path the directory of the class name: it writes the marker
// on first use, and refuses a directory whose marker names another class
// (a configuration that swapped two classes' paths would otherwise serve
// one class's volumes under the other's name). The default class's
// directory must carry no marker (Owner tells).
func Claim(path, name string) error {
	have, err := Owner(path)
	if err != nil {
		return err
	}
	switch have {
	case name:
		return nil
	case "":
		err := atomicfile.Create(filepath.Join(path, markerFile), []byte(name+"\n"))
		if errors.Is(err, os.ErrExist) {
			return Claim(path, name) // made meanwhile: check it
		}
		if err != nil {
			return fmt.Errorf("device class %s: mark %s: %w", name, path, err)
		}
		return nil
	}
	return fmt.Errorf("device class %s: %s is device class %s's directory (%s says so): a class keeps its directory; "+
		"give %s its own path, or rename the class back: %w", name, path, have, filepath.Join(path, markerFile), name, blockdev.ErrConflict)
}

// Owner is the class whose directory path is, by its marker ("" when it
// has none).
func Owner(path string) (string, error) {
	data, err := os.ReadFile(filepath.Join(path, markerFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("device class marker: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// seenFile, in the default class's directory, lists the named classes the
// node has served and their paths.
const seenFile = "device-classes.json"

// Seen returns the named classes the node has served, by name, with their
// paths (none before the first Remember).
func Seen(defaultDir string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(defaultDir, seenFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("device classes served before: %w", err)
	}
	var seen map[string]string
	if err := json.Unmarshal(data, &seen); err != nil {
		return nil, fmt.Errorf("device classes served before (%s): %w", filepath.Join(defaultDir, seenFile), err)
	}
	if seen == nil {
		seen = map[string]string{}
	}
	return seen, nil
}

// Remember records seen as the named classes the node has served,
// durably, when it differs from what is recorded.
func Remember(defaultDir string, seen map[string]string) error {
	old, err := Seen(defaultDir)
	if err == nil && len(old) == len(seen) {
		same := true
		for k, v := range seen {
			same = same && old[k] == v
		}
		if same {
			return nil
		}
	}
	data, err := json.MarshalIndent(seen, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(defaultDir, seenFile), append(data, '\n')); err != nil {
		return fmt.Errorf("record the device classes: %w", err)
	}
	return nil
}

// Volumes lists the IDs of the volumes whose files are in the class
// directory path (for a class no store serves: a class removed from the
// configuration, or one whose store cannot open). A missing directory has
// none; one that cannot be read is an error.
func Volumes(path string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(path, blockdev.VolumesDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("volumes of %s: %w", path, err)
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), blockdev.ImageSuffix); ok && blockdev.IsVolumeID(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
