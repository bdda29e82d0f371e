package e2e

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// TestUnservedDeviceFailsIO: a ublk device the plugin keeps but cannot
// re-adopt (killed, its state file garbled and its device link gone, so
// that nothing says which volume it serves) holds its writer's I/O only
// for the bound, --ublk-fail-unserved-after (here 10 s): then the writes
// fail with EIO instead of hanging, and the volume's health, the node's
// /healthz and a metric say why. Once the operator restores the link and
// restarts the plugin, it re-adopts the device and serves it again.
func TestUnservedDeviceFailsIO(t *testing.T) {
	const bound = 10 * time.Second
	p := newPlugin(t, "--ublk-fail-unserved-after="+bound.String())
	v := p.provision("unserved", 64<<20, blockCap(), nil)
	dev := readLink(t, p.devLink(v))
	p.kill9()
	stateDir := filepath.Join(p.dataDir, blockdev.UblkStateDir)
	if err := os.WriteFile(filepath.Join(stateDir, v.storeID()+".json"), []byte("{\"volumeID\": garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p.devLink(v)); err != nil {
		t.Fatal(err)
	}
	p.start()
	start := time.Now()

	// A writer with the device open: its write waits while the device
	// holds its I/O, then fails.
	done := make(chan error, 1)
	go func() {
		fd, err := unix.Open(v.target, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(fd)
		buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			done <- err
			return
		}
		_, err = unix.Pwrite(fd, buf, 1<<20)
		done <- err
	}()
	limit := bound + 20*time.Second // the bound, and a slow VM's start and scan
	waited := true
	select {
	case err := <-done:
		took := time.Since(start)
		if !errors.Is(err, unix.EIO) {
			t.Errorf("write to the unserved device %s: %v after %v, want EIO", dev, err, took)
		}
		t.Logf("write to the unserved device %s failed with %v %v after the plugin started (bound %v)", dev, err, took.Round(time.Millisecond), bound)
	case <-time.After(limit):
		waited = false
		t.Errorf("write to the unserved device %s still waits %v after the plugin started (bound %v)\n%s", dev, limit, bound, p.logTail())
	}
	if waited {
		if h := volumeHealth(t, p, v); !slices.Contains(h, "DeviceFailingIO") {
			t.Errorf("health of %s = %v, want DeviceFailingIO", v.storeID(), h)
		}
		resp, err := http.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "fails its i/o") {
			t.Errorf("/healthz = %s %q, want 200 saying the device fails its I/O", resp.Status, body)
		}
		if n := p.metric("fastblk_ublk_devices_failing_io"); n != 1 {
			t.Errorf("fastblk_ublk_devices_failing_io = %v, want 1", n)
		}
	}

	// The operator restores the link and restarts the plugin: the device
	// is re-adopted from the volume's record and serves again (and a
	// write still waiting completes).
	if err := os.Symlink(dev, p.devLink(v)); err != nil {
		t.Fatal(err)
	}
	p.kill9()
	p.start()
	if !waited {
		if err := <-done; err != nil {
			t.Errorf("the waiting write after the device was re-adopted: %v", err)
		}
	}
	writeDirect(t, v.target, 2<<20, pattern4k(7))
}
