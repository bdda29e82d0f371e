package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// TestRecoveryKill9UnreadableState kills the plugin with fio verify
// writing to a mounted ext4 volume and a second ext4 volume mounted idle,
// garbles both volumes' ublk state files, and restarts it. The first
// volume's record (its file, size and device link) agrees with the kernel's
// view of its device: the plugin re-adopts it with no operator step, fio
// finishes and its data verifies, and a good state file is written. The
// second volume's device link is gone too, so nothing says which device is
// its: the plugin keeps the device and its mount, holds its I/O, says so
// in the volume's health and on /healthz without failing it; once the
// operator restores the link it heals too, its data intact.
func TestRecoveryKill9UnreadableState(t *testing.T) {
	p := newPlugin(t)
	p.args = append(p.args, "--reconcile-retry=2s")
	a := p.provision("heal-a", 256<<20, mountCap("ext4"), nil)
	b := p.provision("heal-b", 256<<20, mountCap("ext4"), nil)
	sumB := writeRandom(t, filepath.Join(b.target, "data"), 8<<20)
	devA, devB := readLink(t, p.devLink(a)), readLink(t, p.devLink(b))

	fioFile := filepath.Join(a.target, "fio.dat")
	fio := fioVerify(fioFile, "64M", false)
	out := &strings.Builder{}
	fio.Stdout, fio.Stderr = out, out
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() { // before the volume's release: it must unmount
		if !waited {
			fio.Process.Kill()
			fio.Wait()
		}
	})
	waitWrites(t, p.devLink(a), 2000)
	p.kill9()
	stateDir := filepath.Join(p.dataDir, blockdev.UblkStateDir)
	for _, v := range []*volume{a, b} {
		if err := os.WriteFile(filepath.Join(stateDir, v.storeID()+".json"), []byte("{\"volumeID\": garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(p.devLink(b)); err != nil {
		t.Fatal(err)
	}
	p.start()

	// The first volume was re-adopted at start (the plugin restores staged
	// volumes before it serves), its state rewritten from its record, the
	// garbled one kept.
	sts, _ := ublk.States(stateDir)
	i := slices.IndexFunc(sts, func(st ublk.State) bool { return st.VolumeID == a.storeID() })
	if i < 0 || "/dev/ublkb"+itoa(sts[i].DevID) != devA || sts[i].File != p.backingFile(a) {
		t.Fatalf("state files %+v: none for %s on %s\n%s", sts, a.storeID(), devA, p.logTail())
	}
	if healed, _ := filepath.Glob(filepath.Join(stateDir, a.storeID()+".json.corrupt-*.healed")); len(healed) != 1 {
		t.Errorf("set-aside state of %s not kept as healed: %v", a.storeID(), healed)
	}

	// The second: held, its device and mount kept, and said so.
	if _, err := os.Stat("/sys/class/ublk-char/ublkc" + strings.TrimPrefix(devB, "/dev/ublkb")); err != nil {
		t.Fatalf("held device %s: %v", devB, err)
	}
	if h := volumeHealth(t, p, b); !slices.Contains(h, "DeviceHeld") {
		t.Fatalf("health of %s = %v, want DeviceHeld\n%s", b.storeID(), h, p.logTail())
	}
	resp, err := http.Get("http://" + metricsAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "volume "+b.storeID()+": device held") {
		t.Fatalf("/healthz = %s %q, want 200 naming the held volume %s", resp.Status, body, b.storeID())
	}

	// The operator restores the link: the next reconcile heals it.
	if err := os.Symlink(devB, p.devLink(b)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for slices.Contains(volumeHealth(t, p, b), "DeviceHeld") {
		if time.Now().After(deadline) {
			t.Fatalf("%s still held a minute after its link was restored\n%s", b.storeID(), p.logTail())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// It serves: a synced write returns, and both files read back from
	// the device (the page cache dropped) with their checksums.
	sumB2 := writeRandom(t, filepath.Join(b.target, "data2"), 4<<20)
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Fatal(err)
	}
	for name, sum := range map[string][sha256.Size]byte{"data": sumB, "data2": sumB2} {
		got, err := os.ReadFile(filepath.Join(b.target, name))
		if err != nil || sha256.Sum256(got) != sum {
			t.Fatalf("%s of %s after healing: %v, checksum differs: %t", name, b.storeID(), err, err == nil)
		}
	}

	// The first volume's writes, running across the kill, complete and
	// verify.
	err = waitCmd(fio, 10*time.Minute)
	waited = true
	if err != nil || strings.Contains(out.String(), "verify: bad") {
		t.Fatalf("fio on %s after the restart: %v\n%s\n%s", fioFile, err, out, p.logTail())
	}
	runFio(t, fioVerify(fioFile, "64M", true))
}

// writeRandom writes n random bytes to path, syncs them and returns their
// checksum.
func writeRandom(t *testing.T, path string, n int) [sha256.Size]byte {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

func readLink(t *testing.T, link string) string {
	t.Helper()
	dev, err := os.Readlink(link)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// volumeHealth returns the reasons NodeGetVolumeHealth gives for v.
func volumeHealth(t *testing.T, p *plugin, v *volume) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := p.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth %s: %v", v.id, err)
	}
	var reasons []string
	for _, h := range r.GetVolumeHealth().GetHealthStatuses() {
		reasons = append(reasons, h.GetReason())
		t.Logf("%s: %s: %s", v.storeID(), h.GetReason(), h.GetMessage())
	}
	return reasons
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
