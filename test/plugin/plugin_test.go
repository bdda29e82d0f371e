// Package plugin tests the csi-fastblk binary as operators run it: `serve`
// as a separate process, driven over its CSI socket, observed through
// /metrics, /healthz and `csi-fastblk status`. The plugin runs on the loop
// backend, or on the one FASTBLK_TEST_BACKEND names (ublk in the VM, where
// FASTBLK_BIN names the prebuilt binary: hack/vm/guest/steps/44-*).
package plugin

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

type runningPlugin struct {
	bin, metrics, dir string
	dataDir           string
	cmd               *exec.Cmd
	conn              *grpc.ClientConn
	exited            chan error
}

// testBackend is the backend the plugin serves with: FASTBLK_TEST_BACKEND,
// or loop.
func testBackend() string {
	if b := os.Getenv("FASTBLK_TEST_BACKEND"); b != "" {
		return b
	}
	return "loop"
}

// buildBinary builds the plugin with the given build tags (failpoint: see
// pkg/blockdev/failpoint_on.go). Without tags, FASTBLK_BIN names a binary
// to use instead (the VM has no Go toolchain).
func buildBinary(t *testing.T, tags ...string) string {
	t.Helper()
	if bin := os.Getenv("FASTBLK_BIN"); bin != "" && len(tags) == 0 {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "csi-fastblk")
	out, err := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", bin, "../../cmd/csi-fastblk").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startPlugin(t *testing.T) *runningPlugin {
	t.Helper()
	return launch(t, buildBinary(t), t.TempDir())
}

// launch runs bin's serve on dir (socket, data and device directories, log)
// with env added to its environment.
func launch(t *testing.T, bin, dir string, env ...string) *runningPlugin {
	t.Helper()
	return launchWith(t, bin, dir, filepath.Join(dir, "data"), nil, env...)
}

// launchArgs is launch with extra serve flags.
func launchArgs(t *testing.T, bin, dir string, args []string, env ...string) *runningPlugin {
	t.Helper()
	return launchWith(t, bin, dir, filepath.Join(dir, "data"), args, env...)
}

// launchOn is launch with the data directory at dataDir.
func launchOn(t *testing.T, bin, dir, dataDir string, env ...string) *runningPlugin {
	t.Helper()
	return launchWith(t, bin, dir, dataDir, nil, env...)
}

// launchWith starts the plugin with its data directory at dataDir and
// extra serve flags.
func launchWith(t *testing.T, bin, dir, dataDir string, args []string, env ...string) *runningPlugin {
	t.Helper()
	p := &runningPlugin{bin: bin, metrics: freePort(t), dir: dir, dataDir: dataDir, exited: make(chan error, 1)}
	sock := filepath.Join(p.dir, "csi.sock")
	os.Remove(sock) // left by a killed predecessor: wait for the new one
	p.cmd = exec.Command(p.bin, "serve", "--endpoint", "unix://"+sock, "--backend", testBackend(),
		"--data-dir", dataDir, "--dev-dir", filepath.Join(p.dir, "dev"),
		"--node-id", "plugin-test", "--metrics-address", p.metrics, "-v=2")
	p.cmd.Args = append(p.cmd.Args, args...)
	p.cmd.Env = append(os.Environ(), env...)
	logf, err := os.OpenFile(filepath.Join(p.dir, "plugin.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("plugin log:\n%s", b)
		}
	})
	waitFor(t, "plugin socket", func() bool { _, err := os.Stat(sock); return err == nil })
	p.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

// provision creates a volume of size bytes for capability c, stages it at
// <dir>/staging and publishes it at <dir>/pod/<targetName>, as kubelet does.
func (p *runningPlugin) provision(t *testing.T, name string, size int64, c *csi.VolumeCapability, targetName string) (id, staging, target string) {
	t.Helper()
	return p.provisionAt(t, name, size, c, filepath.Join(p.dir, "staging"), targetName, nil)
}

// provisionAt is provision with its own staging path and CreateVolume
// parameters (those the external-provisioner adds, for example).
func (p *runningPlugin) provisionAt(t *testing.T, name string, size int64, c *csi.VolumeCapability, staging, targetName string,
	params map[string]string) (id, _, target string) {
	t.Helper()
	vol, err := csi.NewControllerClient(p.conn).CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
		Parameters: params, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c}})
	if err != nil {
		t.Fatal(err)
	}
	id = vol.GetVolume().GetVolumeId()
	return id, staging, p.publish(t, id, c, staging, targetName)
}

// publish stages volume id at staging and publishes it at
// <dir>/pod/<targetName>, as kubelet does when a pod starts, and returns
// the target path.
func (p *runningPlugin) publish(t *testing.T, id string, c *csi.VolumeCapability, staging, targetName string) string {
	t.Helper()
	ctx := context.Background()
	node := csi.NewNodeClient(p.conn)
	target := filepath.Join(p.dir, "pod", targetName)
	os.MkdirAll(staging, 0o750)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: c}); err != nil {
		t.Fatal(err)
	}
	return target
}

// unpublish unpublishes and unstages what publish did, as kubelet does
// when the pod goes.
func (p *runningPlugin) unpublish(t *testing.T, id, staging, target string) {
	t.Helper()
	ctx := context.Background()
	node := csi.NewNodeClient(p.conn)
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// release unpublishes, unstages and deletes what provision made.
func (p *runningPlugin) release(t *testing.T, id, staging, target string) {
	t.Helper()
	p.unpublish(t, id, staging, target)
	if _, err := csi.NewControllerClient(p.conn).DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// stop sends the plugin SIGTERM and waits for it to exit cleanly.
func (p *runningPlugin) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("plugin exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("plugin did not stop within 30s of SIGTERM")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *runningPlugin) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of the sample whose line starts with prefix.
func metric(t *testing.T, body, prefix string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no sample %s in metrics", prefix)
	return 0
}

// TestServeMetricsAndStatus runs the real binary, provisions and publishes a
// raw block volume over CSI, writes to it, and checks that /metrics moves,
// /healthz answers, `csi-fastblk status` shows the volume, and SIGTERM stops
// the plugin cleanly.
func TestServeMetricsAndStatus(t *testing.T) {
	testgate.RequireRoot(t)
	p := startPlugin(t)
	capBlock := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	// The PVC and PV names come as the external-provisioner passes them
	// with --extra-create-metadata.
	id, staging, target := p.provisionAt(t, "metrics-vol", 32<<20, capBlock, filepath.Join(p.dir, "staging"), "dev",
		map[string]string{"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "apps",
			"csi.storage.k8s.io/pv/name": "metrics-vol"})
	// Metrics and status name the volume by the store's ID: the CSI ID
	// without its node tag.
	storeID := storeIDOf(id)
	labels := func(op string) string {
		return fmt.Sprintf(`{device_class="default",name="metrics-vol",namespace="apps",%spersistentvolume="metrics-vol",persistentvolumeclaim="data",volume_id="%s"}`, op, storeID)
	}
	writes := "fastblk_volume_ios_total" + labels(`op="write",`)
	_, body := p.get(t, "/metrics")
	before := metric(t, body, writes)
	allocBefore := metric(t, body, "fastblk_volume_allocated_bytes"+labels(""))
	f, err := os.OpenFile(target, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	// O_DIRECT needs an aligned buffer: take one from mmap, off the Go heap.
	buf, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(buf)
	for i := range 4 {
		if _, err := f.WriteAt(buf, int64(i)<<20); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	_, body = p.get(t, "/metrics")
	if after := metric(t, body, writes); after < before+4 {
		t.Errorf("write I/Os %v → %v after 4 MiB of direct writes; want them to move", before, after)
	}
	written := metric(t, body, "fastblk_volume_bytes_total"+labels(`op="write",`))
	if written < 4<<20 {
		t.Errorf("bytes written = %v, want ≥ 4 MiB", written)
	}
	// The sparse file took the 4 MiB written (direct I/O reached it).
	if alloc := metric(t, body, "fastblk_volume_allocated_bytes"+labels("")); alloc < allocBefore+4<<20 || alloc > 32<<20 {
		t.Errorf("allocated bytes %v → %v after 4 MiB written to a 32 MiB volume", allocBefore, alloc)
	}
	if metric(t, body, "fastblk_node_capacity_available_bytes") <= 0 {
		t.Error("node capacity not reported")
	}
	if free := metric(t, body, "fastblk_node_filesystem_free_bytes"); free <= 0 {
		t.Errorf("node filesystem free = %v", free)
	}
	buildInfo := fmt.Sprintf(`fastblk_build_info{backend=%q,`, testBackend())
	if metric(t, body, "fastblk_healthy ") != 1 || metric(t, body, buildInfo) != 1 {
		t.Errorf("fastblk_healthy (no labels) or %s...} not 1", buildInfo)
	}
	if code, _ := p.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	// The metrics port is reachable from the network; the volume names
	// and paths of /status are not served there.
	if code, body := p.get(t, "/status"); code != http.StatusNotFound {
		t.Errorf("/status on the metrics address = %d, want 404: it discloses %.80q...", code, body)
	}

	out, err := exec.Command(p.bin, "status", "--address", "unix://"+filepath.Join(p.dir, "status.sock")).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{storeID, "metrics-vol", "block", testBackend(), "healthy"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`metrics-vol\s+default\s+32\.0MiB`).Match(out) {
		t.Errorf("status output lacks the volume size:\n%s", out)
	}

	p.release(t, id, staging, target)
	p.stop(t)
}

// storeIDOf is the store's ID of a volume, which metrics, status and files
// use: its CSI ID without the node tag.
func storeIDOf(id string) string {
	storeID, _, _ := strings.Cut(id, "-")
	return storeID
}
