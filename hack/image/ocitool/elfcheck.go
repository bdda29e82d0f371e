package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// machines maps GOARCH to the ELF machine and Debian's multiarch triplet.
var machines = map[string]struct {
	machine elf.Machine
	triplet string
}{
	"amd64": {elf.EM_X86_64, "x86_64-linux-gnu"},
	"arm64": {elf.EM_AARCH64, "aarch64-linux-gnu"},
}

// elfCheck walks the executables and shared libraries of rootfs and
// checks each is built for goarch, its interpreter exists in rootfs, and
// every library it needs is in the directories the dynamic loader
// searches (Debian's multiarch ones; links are followed inside rootfs).
// It returns how many ELF files it checked.
func elfCheck(rootfs, goarch string) (int, error) {
	m, ok := machines[goarch]
	if !ok {
		return 0, fmt.Errorf("unknown architecture %q", goarch)
	}
	libDirs := []string{"/lib/" + m.triplet, "/usr/lib/" + m.triplet, "/lib", "/usr/lib"}
	var errs []error
	n := 0
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not an ELF file
		}
		defer f.Close()
		if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
			return nil
		}
		n++
		rel := strings.TrimPrefix(p, rootfs)
		if f.Machine != m.machine {
			errs = append(errs, fmt.Errorf("%s: machine %s, want %s", rel, f.Machine, m.machine))
			return nil
		}
		if interp := interpreter(f); interp != "" && !exists(rootfs, interp) {
			errs = append(errs, fmt.Errorf("%s: interpreter %s missing", rel, interp))
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rel, err))
			return nil
		}
		dirs := append(runPath(f, path.Dir(filepath.ToSlash(rel))), libDirs...)
		for _, lib := range libs {
			if !found(rootfs, lib, dirs) {
				errs = append(errs, fmt.Errorf("%s: needs %s, not found in %v", rel, lib, dirs))
			}
		}
		return nil
	})
	return n, errors.Join(append(errs, err)...)
}

// runPath is the file's own library path (DT_RUNPATH, DT_RPATH), with
// $ORIGIN as dir, the file's directory in the image.
func runPath(f *elf.File, dir string) []string {
	var out []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				d = strings.NewReplacer("${ORIGIN}", dir, "$ORIGIN", dir).Replace(d)
				if path.IsAbs(d) {
					out = append(out, path.Clean(d))
				}
			}
		}
	}
	return out
}

func interpreter(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return strings.TrimRight(string(b), "\x00")
			}
		}
	}
	return ""
}

func found(rootfs, lib string, dirs []string) bool {
	for _, d := range dirs {
		if exists(rootfs, path.Join(d, lib)) {
			return true
		}
	}
	return false
}

// exists resolves p inside rootfs, following absolute links as the
// image's own root would, at most 40 deep.
func exists(rootfs, p string) bool {
	for range 40 {
		full := filepath.Join(rootfs, p)
		fi, err := os.Lstat(full)
		if err != nil {
			// A parent may be a link (lib -> usr/lib): resolve it.
			dir, base := path.Split(p)
			if dir == "/" || dir == "" {
				return false
			}
			rd, ok := resolveDir(rootfs, path.Clean(dir))
			if !ok || rd == path.Clean(dir) {
				return false
			}
			p = path.Join(rd, base)
			continue
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return true
		}
		t, err := os.Readlink(full)
		if err != nil {
			return false
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return false
}

// resolveDir follows links of dir's components inside rootfs.
func resolveDir(rootfs, dir string) (string, bool) {
	out := "/"
	for _, c := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		next := path.Join(out, c)
		for range 40 {
			fi, err := os.Lstat(filepath.Join(rootfs, next))
			if err != nil {
				return "", false
			}
			if fi.Mode()&os.ModeSymlink == 0 {
				break
			}
			t, err := os.Readlink(filepath.Join(rootfs, next))
			if err != nil {
				return "", false
			}
			if !path.IsAbs(t) {
				t = path.Join(path.Dir(next), t)
			}
			next = t
		}
		out = next
	}
	return out, true
}
