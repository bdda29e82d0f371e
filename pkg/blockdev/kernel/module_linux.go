package kernel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Why a module cannot be loaded, as LoadModule's errors wrap them.
var (
	// ErrNoModules: the kernel was built without loadable modules, so
	// what it does not have built in it cannot get.
	ErrNoModules = errors.New("the kernel loads no modules")
	// ErrModuleAbsent: the running kernel has no such module (its
	// modules.dep under /lib/modules does not list it, or there is no
	// /lib/modules directory for it at all).
	ErrModuleAbsent = errors.New("the kernel has no such module")
)

// modprobeTimeout bounds a module's loading.
const modprobeTimeout = 30 * time.Second

// ModuleLoaded reports whether the module name is loaded or built in (the
// kernel lists both under /sys/module; dashes in a name are underscores
// there).
func ModuleLoaded(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/module", strings.ReplaceAll(name, "-", "_")))
	return err == nil
}

// LoadModule loads the kernel module name unless it is loaded or built in.
// It runs the program the kernel itself runs to load modules (the path in
// /proc/sys/kernel/modprobe, where this process sees it), else modprobe
// from PATH. Its error says why a module cannot be had, wrapping
// ErrNoModules or ErrModuleAbsent where that is the cause, else the
// program's failure with its output (module loading disabled, a signature
// the kernel refuses, ...).
func LoadModule(ctx context.Context, name string) error {
	if ModuleLoaded(name) {
		return nil
	}
	release := Release()
	if _, err := os.Stat("/proc/modules"); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kernel %s has no %s: it is not built in, and %w (no /proc/modules)", release, name, ErrNoModules)
	}
	prog, err := modprobe()
	if err != nil {
		return fmt.Errorf("load %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, modprobeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, prog, name).CombinedOutput()
	if err == nil && ModuleLoaded(name) {
		return nil
	}
	msg := strings.TrimSpace(string(out))
	if err == nil {
		err = fmt.Errorf("it succeeded, but /sys/module/%s does not exist", name)
	}
	if why := moduleAbsent(release, name); why != "" {
		return fmt.Errorf("kernel %s has no %s: %s: %w (%s: %s)", release, name, why, ErrModuleAbsent, prog, msg)
	}
	return fmt.Errorf("load %s: %s %s: %w: %s", name, prog, name, err, msg)
}

// modprobe is the program that loads modules here: the kernel's own
// helper if this process can run it (a container may have none at that
// path), else modprobe from PATH.
func modprobe() (string, error) {
	if b, err := os.ReadFile("/proc/sys/kernel/modprobe"); err == nil {
		p := strings.TrimSpace(string(b))
		if fi, err := os.Stat(p); err == nil && filepath.IsAbs(p) && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("modprobe")
	if err != nil {
		return "", fmt.Errorf("no modprobe: neither the kernel's helper (/proc/sys/kernel/modprobe) nor one in PATH can run here: %w", err)
	}
	return p, nil
}

// moduleAbsent says why the kernel release has no module name, or ""
// when its modules.dep lists it (or cannot be read: then the load's own
// error says more).
func moduleAbsent(release, name string) string {
	dir := filepath.Join("/lib/modules", release)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("there is no %s (the node's modules are not installed, or not mounted into this container)", dir)
	}
	dep, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return ""
	}
	want := strings.ReplaceAll(name, "-", "_")
	s := bufio.NewScanner(bytes.NewReader(dep))
	for s.Scan() {
		file, _, _ := strings.Cut(s.Text(), ":")
		base, _, _ := strings.Cut(filepath.Base(file), ".ko")
		if strings.ReplaceAll(base, "-", "_") == want {
			return ""
		}
	}
	return fmt.Sprintf("%s lists no %s", filepath.Join(dir, "modules.dep"), name)
}
