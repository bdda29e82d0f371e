package devclass

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func TestCheckName(t *testing.T) {
	for _, name := range []string{"a", "nvme", "fast-ssd", "x1", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q): %v", name, err)
		}
	}
	for _, name := range []string{"", "Fast", "fast_ssd", "-a", "a-", "a.b", "a b", "nvme/0", strings.Repeat("a", MaxNameLen+1)} {
		if err := CheckName(name); !errors.Is(err, blockdev.ErrInvalid) {
			t.Errorf("CheckName(%q) = %v, want ErrInvalid", name, err)
		}
	}
}

// TestCheckRefusesBadDirectories: every way a class's directory can be
// wrong gives its own error, naming the class and what to do.
func TestCheckRefusesBadDirectories(t *testing.T) {
	base := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(base, p)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	def, fast, other := mk("default"), mk("fast"), mk("other")
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	reserved := func(c Class) Class { c.ReserveBytes = 1 << 30; return c }
	sameFS := mk("root") // stands for the node's root filesystem
	for _, tc := range []struct {
		name   string
		c      Class
		others []Class
		refs   []string
		want   error
		says   string
	}{
		{"bad name", Class{Name: "Fast", Path: fast}, nil, nil, blockdev.ErrInvalid, "lowercase"},
		{"the default's name", Class{Name: Default, Path: fast}, nil, nil, blockdev.ErrInvalid, "--data-dir"},
		{"relative path", Class{Name: "fast", Path: "fast"}, nil, nil, blockdev.ErrInvalid, "not absolute"},
		{"missing path", Class{Name: "fast", Path: filepath.Join(base, "nowhere")}, nil, nil, blockdev.ErrNotFound, "is its disk mounted"},
		{"a file", Class{Name: "fast", Path: file}, nil, nil, blockdev.ErrInvalid, "not a directory"},
		{"the default's directory", reserved(Class{Name: "fast", Path: def}), nil, nil, blockdev.ErrInvalid, "overlaps device class default"},
		{"inside the default's", reserved(Class{Name: "fast", Path: mk("default/sub")}), nil, nil, blockdev.ErrInvalid, "overlaps device class default"},
		{"holding another class's", reserved(Class{Name: "fast", Path: base}), []Class{{Name: "other", Path: other}}, nil, blockdev.ErrInvalid, "overlaps"},
		{"another class's", reserved(Class{Name: "fast", Path: other}), []Class{{Name: "other", Path: other}}, nil, blockdev.ErrInvalid, "overlaps device class other"},
		{"root filesystem without a reserve", Class{Name: "fast", Path: fast}, nil, []string{sameFS}, blockdev.ErrInvalid, "root filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.c, def, tc.others, tc.refs)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Check(%+v) = %v, want %v saying %q", tc.c, err, tc.want, tc.says)
			}
			if !strings.Contains(err.Error(), tc.c.Name) && tc.c.Name != "Fast" {
				t.Errorf("error %q does not name the class", err)
			}
		})
	}
}

// TestCheckAccepts: a class with a directory of its own passes; on the
// root filesystem it passes with a reserve, and anywhere else without.
func TestCheckAccepts(t *testing.T) {
	base := t.TempDir()
	def, fast, other := filepath.Join(base, "default"), filepath.Join(base, "fast"), filepath.Join(base, "other")
	for _, d := range []string{def, fast, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	others := []Class{{Name: "other", Path: other}, {Name: "fast", Path: fast}}
	if err := Check(Class{Name: "fast", Path: fast, ReserveRatio: 0.1}, def, others, []string{base}); err != nil {
		t.Errorf("a reserved class on the root filesystem: %v", err)
	}
	// /proc is a filesystem of its own: the class is not on it.
	if err := Check(Class{Name: "fast", Path: fast}, def, others, []string{"/proc"}); err != nil {
		t.Errorf("a class on another filesystem than the root's: %v", err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(fast, link); err != nil {
		t.Fatal(err)
	}
	if err := Check(Class{Name: "alias", Path: link, ReserveBytes: 1}, def, others, nil); err == nil || !strings.Contains(err.Error(), "overlaps device class fast") {
		t.Errorf("a symbolic link to another class's directory: %v, want an overlap", err)
	}
}

// TestClaim: a class's directory is marked on first use, taken again by
// the same class, and refused to another.
func TestClaim(t *testing.T) {
	dir := t.TempDir()
	if who, err := Owner(dir); err != nil || who != "" {
		t.Fatalf("Owner of a new directory = %q, %v", who, err)
	}
	if err := Claim(dir, "fast"); err != nil {
		t.Fatal(err)
	}
	if err := Claim(dir, "fast"); err != nil {
		t.Fatalf("the same class again: %v", err)
	}
	if who, _ := Owner(dir); who != "fast" {
		t.Errorf("Owner = %q, want fast", who)
	}
	err := Claim(dir, "slow")
	if !errors.Is(err, blockdev.ErrConflict) || !strings.Contains(err.Error(), "device class fast's directory") {
		t.Errorf("another class: %v, want a conflict naming fast", err)
	}
}

// TestSeenRemembered: the classes served are recorded durably and read
// back; an unchanged set is not written again.
func TestSeenRemembered(t *testing.T) {
	dir := t.TempDir()
	seen, err := Seen(dir)
	if err != nil || len(seen) != 0 {
		t.Fatalf("Seen before any: %v, %v", seen, err)
	}
	want := map[string]string{"fast": "/mnt/fast", "bulk": "/mnt/bulk"}
	if err := Remember(dir, want); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, seenFile)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := Remember(dir, map[string]string{"bulk": "/mnt/bulk", "fast": "/mnt/fast"}); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := os.Stat(file); !os.SameFile(fi, fi2) {
		t.Errorf("an unchanged set was written again")
	}
	got, err := Seen(dir)
	if err != nil || len(got) != 2 || got["fast"] != "/mnt/fast" || got["bulk"] != "/mnt/bulk" {
		t.Errorf("Seen = %v, %v; want %v", got, err, want)
	}
	if err := os.WriteFile(file, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Seen(dir); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("a torn record: %v, want an error naming %s", err, file)
	}
}

func TestVolumes(t *testing.T) {
	dir := t.TempDir()
	if ids, err := Volumes(filepath.Join(dir, "gone")); err != nil || ids != nil {
		t.Errorf("a missing directory: %v, %v", ids, err)
	}
	vols := filepath.Join(dir, blockdev.VolumesDir)
	if err := os.Mkdir(vols, 0o700); err != nil {
		t.Fatal(err)
	}
	a, b := blockdev.VolumeID("a"), blockdev.VolumeID("b")
	for _, n := range []string{b + ".img", a + ".img", "junk.img", blockdev.SnapshotID("s") + ".img", ".tmp-" + a + ".img"} {
		if err := os.WriteFile(filepath.Join(vols, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := Volumes(dir)
	if want := []string{min(a, b), max(a, b)}; err != nil || !slices.Equal(ids, want) {
		t.Errorf("Volumes = %v, %v; want %v", ids, err, want)
	}
}
