package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
)

// TestPluginLoadsUblk: on a node whose kernel has ublk_drv as a module that
// nothing loaded, the plugin with --backend auto loads it itself (with the
// kernel's own module helper) and serves its volumes with ublk, not loop,
// saying so in its log (issue 52: it fell back to loop silently). The
// VM's boot loads the module; the test unloads it first, as a node boots
// without it.
func TestPluginLoadsUblk(t *testing.T) {
	bin := requireVM(t)
	if left := ublkDevices(t); len(left) > 0 {
		t.Fatalf("ublk devices %v exist: ublk_drv cannot be unloaded", left)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := unix.DeleteModule("ublk_drv", unix.O_NONBLOCK)
		if err == nil || errors.Is(err, unix.ENOENT) {
			break
		}
		// EBUSY or EAGAIN: the last device's control file is closing.
		if time.Now().After(deadline) {
			t.Fatalf("unload ublk_drv: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		// The next tests need it, whatever happened here.
		if err := kernel.LoadModule(context.Background(), "ublk_drv"); err != nil {
			t.Errorf("load ublk_drv again: %v", err)
		}
	})
	for _, p := range []string{"/sys/module/ublk_drv", "/dev/ublk-control"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after unloading ublk_drv: %v", p, err)
		}
	}

	p := startBinary(t, bin, -1, "--backend", "auto")
	v := p.provision("loaded", 64<<20, blockCap(), nil)
	dev, err := filepath.EvalSymlinks(p.devLink(v))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dev, "/dev/ublkb") {
		t.Fatalf("the volume's device is %s, want a ublk device (the plugin fell back to loop?)\n%s", dev, p.logTail())
	}
	if _, err := os.Stat("/sys/module/ublk_drv"); err != nil {
		t.Fatalf("ublk_drv: %v", err)
	}
	log, err := os.ReadFile(filepath.Join(p.dir, "plugin.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"loaded the kernel module" module="ublk_drv"`) || strings.Contains(string(log), "fastblk_backend_fallback") {
		t.Errorf("the plugin's log does not say it loaded ublk_drv, or says it fell back:\n%s", log)
	}
	t.Logf("the plugin loaded ublk_drv and serves %s on %s", v.id, dev)
}
