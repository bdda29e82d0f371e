package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// requireVM skips unless the test can make ublk devices and run the
// plugin binary.
func requireVM(t *testing.T) string {
	t.Helper()
	testgate.RequireUblk(t)
	bin := os.Getenv("FASTBLK_BIN")
	if bin == "" {
		bin = "/bin/csi-fastblk"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("plugin binary %s: %v (set FASTBLK_BIN)", bin, err)
	}
	return bin
}

// workDir is a directory on a disk filesystem ($FASTBLK_DATA in the VM).
func workDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("FASTBLK_DATA")
	if base == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(base, "e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// plugin is one csi-fastblk serve process and its CSI clients.
type plugin struct {
	t                         *testing.T
	bin, dir, dataDir, devDir string
	sock                      string
	cmd                       *exec.Cmd
	conn                      *grpc.ClientConn
	ctrl                      csi.ControllerClient
	node                      csi.NodeClient
	// cgroupFD, when set, is the cgroup (an open directory) the plugin
	// starts in.
	cgroupFD int
	// args are extra serve flags.
	args []string
	// mountNS, when set, starts the plugin in a mount namespace of its
	// own (as a container runs it), its mounts copied with their
	// propagation.
	mountNS bool
}

// newPlugin starts the plugin with the serve flags args besides the
// harness's own.
func newPlugin(t *testing.T, args ...string) *plugin { return newPluginIn(t, -1, args...) }

// newPluginIn starts the plugin in the cgroup open as cgroupFD (-1: this
// process's cgroup), with extra serve flags args.
func newPluginIn(t *testing.T, cgroupFD int, args ...string) *plugin {
	return startBinary(t, requireVM(t), cgroupFD, args...)
}

// startBinary is newPluginIn with the plugin binary bin, whatever the
// kernel offers.
func startBinary(t *testing.T, bin string, cgroupFD int, args ...string) *plugin {
	dir := workDir(t)
	p := &plugin{t: t, bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"),
		devDir: filepath.Join(dir, "dev"), sock: filepath.Join(dir, "csi.sock"), cgroupFD: cgroupFD, args: args}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *plugin) start() {
	p.t.Helper()
	os.Remove(p.sock)
	logf, err := os.OpenFile(filepath.Join(p.dir, "plugin.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	args := []string{"serve", "--endpoint", "unix://" + p.sock, "--node-id", "e2e-node",
		"--data-dir", p.dataDir, "--driver-name", "fastblk.csi.io", "--backend", "ublk",
		"--dev-dir", p.devDir, "--metrics-address", metricsAddr, "-v=2"}
	p.cmd = exec.Command(p.bin, append(args, p.args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if p.cgroupFD > 0 {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: p.cgroupFD}
	}
	if p.mountNS {
		// Cloneflags, not Unshareflags: Go would make every mount of
		// the new namespace private.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	logf.Close()
	p.conn, err = grpc.NewClient("unix://"+p.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.ctrl, p.node = csi.NewControllerClient(p.conn), csi.NewNodeClient(p.conn)
	id := csi.NewIdentityClient(p.conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := id.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && (r.GetReady() == nil || r.GetReady().GetValue()) {
			return
		}
		if time.Now().After(deadline) || p.cmd.ProcessState != nil {
			// Killed first: a plugin left running would hold the
			// metrics address, and every later test would fail.
			p.cmd.Process.Kill()
			p.cmd.Wait()
			p.cmd = nil
			p.t.Fatalf("plugin not ready: %v\n%s", err, p.logTail())
		}
		<-time.After(50 * time.Millisecond)
	}
}

// kill9 kills the plugin the hard way, as an OOM kill or node crash would.
func (p *plugin) kill9() {
	p.t.Helper()
	p.conn.Close()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	p.cmd.Wait()
	p.cmd = nil
}

func (p *plugin) stop() {
	if p.cmd == nil {
		return
	}
	p.conn.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-done
		p.t.Errorf("plugin did not stop on SIGTERM\n%s", p.logTail())
	}
	p.cmd = nil
}

func (p *plugin) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "plugin.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

func mountCap(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// volume is a created, staged and published volume.
type volume struct {
	id, staging, target string
	cap                 *csi.VolumeCapability
}

// provision creates, stages and publishes a volume; teardown is
// registered with t.Cleanup and checked.
func (p *plugin) provision(name string, size int64, c *csi.VolumeCapability, params map[string]string) *volume {
	p.t.Helper()
	return p.provisionReq(&csi.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c}})
}

// provisionReq is provision with the whole CreateVolume request.
func (p *plugin) provisionReq(req *csi.CreateVolumeRequest) *volume {
	p.t.Helper()
	ctx := context.Background()
	name, c := req.GetName(), req.GetVolumeCapabilities()[0]
	cr, err := p.ctrl.CreateVolume(ctx, req)
	if err != nil {
		p.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := &volume{id: cr.GetVolume().GetVolumeId(), cap: c,
		staging: filepath.Join(p.dir, "staging", name), target: filepath.Join(p.dir, "pods", name, "target")}
	if err := os.MkdirAll(v.staging, 0o750); err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
		VolumeCapability: c, VolumeContext: cr.GetVolume().GetVolumeContext()}); err != nil {
		p.t.Fatalf("NodeStageVolume %s: %v\n%s", name, err, p.logTail())
	}
	if _, err := p.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
		TargetPath: v.target, VolumeCapability: c, VolumeContext: cr.GetVolume().GetVolumeContext()}); err != nil {
		p.t.Fatalf("NodePublishVolume %s: %v\n%s", name, err, p.logTail())
	}
	p.t.Cleanup(func() { p.release(v) })
	return v
}

// release unpublishes, unstages and deletes the volume.
func (p *plugin) release(v *volume) {
	if p.cmd == nil {
		return
	}
	ctx := context.Background()
	if _, err := p.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
		p.t.Errorf("NodeUnpublishVolume %s: %v", v.id, err)
	}
	if _, err := p.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		p.t.Errorf("NodeUnstageVolume %s: %v", v.id, err)
	}
	if _, err := p.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
		p.t.Errorf("DeleteVolume %s: %v", v.id, err)
	}
}

// storeID is the volume's ID in the data directory: its CSI ID without
// the node tag.
func (v *volume) storeID() string {
	id, _, _ := strings.Cut(v.id, "-")
	return id
}

// devLink is the stable link to the volume's device.
func (p *plugin) devLink(v *volume) string { return filepath.Join(p.devDir, v.storeID()) }

// backingFile is the volume's file in the data directory.
func (p *plugin) backingFile(v *volume) string {
	return filepath.Join(p.dataDir, "volumes", v.storeID()+".img")
}

// ublkDevices lists the ublk devices present.
func ublkDevices(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/sys/class/ublk-char")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// metricsAddr is where the plugin under test serves /metrics (the VM runs
// one plugin at a time).
const metricsAddr = "127.0.0.1:19811"

// metric returns the value of the first /metrics sample whose line starts
// with prefix, or fails the test.
func (p *plugin) metric(prefix string) float64 {
	p.t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		p.t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		p.t.Fatalf("scrape metrics: status %s, %v", resp.Status, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				p.t.Fatalf("parse %q: %v", line, err)
			}
			return v
		}
	}
	p.t.Fatalf("no sample %s in /metrics", prefix)
	return 0
}
