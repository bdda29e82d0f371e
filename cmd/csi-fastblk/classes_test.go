package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
)

// TestDeviceClassFlags pins --device-class's format and its errors.
func TestDeviceClassFlags(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := serveFlags(fs)
	if err := fs.Parse([]string{"--device-class=name=nvme,path=/mnt/nvme,reserve=10%,over-provision-ratio=2",
		"--device-class", "path=/mnt/hdd,name=hdd,reserve=20Gi"}); err != nil {
		t.Fatal(err)
	}
	want := []devclass.Class{{Name: "nvme", Path: "/mnt/nvme", ReserveRatio: 0.1, OverProvisionRatio: 2},
		{Name: "hdd", Path: "/mnt/hdd", ReserveBytes: 20 << 30, OverProvisionRatio: 1}}
	if len(cfg.classes) != 2 || cfg.classes[0] != want[0] || cfg.classes[1] != want[1] {
		t.Errorf("classes %+v, want %+v", cfg.classes, want)
	}
	for _, tc := range []struct{ flag, says string }{
		{"name=nvme", "name and path are required"},
		{"path=/mnt/x", "name and path are required"},
		{"name=Nvme,path=/mnt/x", "lowercase"},
		{"name=default,path=/mnt/x", "the data directory's class"},
		{"name=a,path=/mnt/x,reserve=lots", "reserve"},
		{"name=a,path=/mnt/x,over-provision-ratio=0.5", "from 1 to 100"},
		{"name=a,path=/mnt/x,size=1", `unknown key "size"`},
		{"name=a,name=b,path=/mnt/x", "name is given twice"},
		{"name=a,path", `"path" is not key=value`},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(new(strings.Builder))
		serveFlags(fs)
		err := fs.Parse([]string{"--device-class=" + tc.flag})
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("--device-class=%s: %v, want an error saying %q", tc.flag, err, tc.says)
		}
	}
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	serveFlags(fs)
	if err := fs.Parse([]string{"--device-class=name=a,path=/x/a", "--device-class=name=a,path=/x/b"}); err == nil ||
		!strings.Contains(err.Error(), "device class a is given twice") {
		t.Errorf("a class twice: %v", err)
	}
}

// TestOpenClasses: the classes that pass their checks open; each one that
// cannot be served is down with why and the volumes in its directory, and
// the node serves the rest; a class removed, or moved, while volumes use
// it is down, its files untouched, and one removed empty is forgotten.
func TestOpenClasses(t *testing.T) {
	dir := t.TempDir()
	def := filepath.Join(dir, "data")
	mk := func(p ...string) string {
		d := filepath.Join(append([]string{dir}, p...)...)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	mk("data")
	fast, slow, empty := mk("fast"), mk("slow"), mk("empty")
	vol := blockdev.VolumeID("pvc-1")
	putVolume := func(classDir string) {
		mk(filepath.Base(classDir), "volumes")
		if err := os.WriteFile(filepath.Join(classDir, "volumes", vol+".img"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	names := func(open []openClass, down []downClass) (string, map[string]downClass) {
		var on []string
		for _, c := range open {
			on = append(on, c.name)
			c.st.Close()
		}
		off := map[string]downClass{}
		for _, c := range down {
			off[c.name] = c
		}
		return strings.Join(on, ","), off
	}

	// First start: fast and slow are served; missing is not, and says why.
	open, down, err := openClasses(def, []devclass.Class{{Name: "fast", Path: fast}, {Name: "slow", Path: slow},
		{Name: "missing", Path: filepath.Join(dir, "nowhere")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, off := names(open, down)
	if on != "fast,slow" || len(off) != 1 || !strings.Contains(off["missing"].why.Error(), "does not exist (is its disk mounted there?)") {
		t.Fatalf("served %s, down %+v", on, off)
	}
	// The volumes the store would hold (the store's layout): slow keeps
	// one, empty has none.
	putVolume(slow)

	// Second start: slow removed while it holds a volume, fast's path
	// swapped to slow's directory, and a class of its own path (empty).
	open, down, err = openClasses(def, []devclass.Class{{Name: "fast", Path: fast}, {Name: "empty", Path: empty},
		{Name: "thief", Path: slow}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, off = names(open, down)
	if on != "fast,empty" {
		t.Errorf("served %s, want fast and empty", on)
	}
	if d := off["slow"]; !strings.Contains(d.why.Error(), "removed from the configuration while 1 of its volumes are in "+slow) ||
		len(d.volumes) != 1 || d.volumes[0] != vol {
		t.Errorf("slow, removed with a volume: %+v", d)
	}
	if d := off["thief"]; d.why == nil || !strings.Contains(d.why.Error(), "is device class slow's directory") {
		t.Errorf("thief, on slow's directory: %+v", d)
	}
	if _, err := os.Stat(filepath.Join(slow, "volumes", vol+".img")); err != nil {
		t.Errorf("slow's volume after it was removed: %v", err)
	}

	// Third start: empty removed (it holds no volume: forgotten), fast
	// moved away from its directory while it holds a volume.
	putVolume(fast)
	elsewhere := mk("elsewhere")
	open, down, err = openClasses(def, []devclass.Class{{Name: "fast", Path: elsewhere}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, off = names(open, down)
	if on != "" || !strings.Contains(off["fast"].why.Error(), "its path changed from "+fast+", which still holds 1 of its volumes") {
		t.Errorf("served %q, fast moved: %+v", on, off["fast"])
	}
	if _, ok := off["empty"]; ok {
		t.Errorf("empty, removed without volumes, is still reported: %+v", off["empty"])
	}
	seen, err := devclass.Seen(def)
	if err != nil || seen["fast"] != fast || seen["slow"] != slow || len(seen) != 2 {
		t.Errorf("classes remembered %v, %v; want fast at its old path and slow", seen, err)
	}

	// A data directory that is a class's is refused whole.
	if err := devclass.Claim(def, "fast"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openClasses(def, nil, nil); err == nil || !strings.Contains(err.Error(), "device class fast's directory") {
		t.Errorf("a class's directory as the data directory: %v", err)
	}
}
