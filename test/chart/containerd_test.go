package chart

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestImageRefIsTheCharts checks that the reference make image names the
// image with (hack/image/ocitool chartref) is the plugin image the chart
// renders by default.
func TestImageRefIsTheCharts(t *testing.T) {
	cmd := exec.Command("go", "run", "./hack/image/ocitool", "chartref", "charts/csi-fastblk")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ocitool chartref: %v", err)
	}
	plugin, _ := nodePod(t, render(t)).container("csi-fastblk")
	if ref := strings.TrimSpace(string(out)); ref != plugin.Image {
		t.Errorf("make image names the image %q, the chart runs %q", ref, plugin.Image)
	}
}

// TestImageImportsIntoContainerd imports the image archive into a private
// containerd (its own root, state and socket in a temporary directory) as
// the image docs say (ctr -n k8s.io images import --all-platforms), checks
// it is listed under the chart's default reference for both platforms,
// and runs the plugin in a container of it. It needs root, containerd,
// ctr and runc, and the archive (make image or $IMAGE_ARCHIVE).
func TestImageImportsIntoContainerd(t *testing.T) {
	readArchive(t) // skips without an archive
	archive := os.Getenv("IMAGE_ARCHIVE")
	if archive == "" {
		archive = filepath.Join(repoRoot(t), "bin", "csi-fastblk-image.oci.tar")
	}
	testgate.RequireRoot(t)
	for _, b := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			testgate.Skip(t, testgate.Chart, "no %s: %v", b, err)
		}
	}
	dir, err := os.MkdirTemp("", "ctrd")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Kill()
		d.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("containerd log:\n%s", b)
		}
		os.RemoveAll(dir)
	})
	ctr := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	waitFor(t, "containerd socket", func() bool { _, err := os.Stat(sock); return err == nil })
	ctr("images", "import", "--all-platforms", archive)
	plugin, _ := nodePod(t, render(t)).container("csi-fastblk")
	ls := ctr("images", "ls")
	if !strings.Contains(ls, plugin.Image+" ") || !strings.Contains(ls, "linux/amd64,linux/arm64") {
		t.Errorf("ctr images ls after import lacks %s for linux/amd64,linux/arm64:\n%s", plugin.Image, ls)
	}
	if out := ctr("run", "--rm", plugin.Image, "image-test", "/usr/bin/csi-fastblk", "version"); strings.TrimSpace(out) == "" {
		t.Error("csi-fastblk version printed nothing in the container")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
