package sanity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
	"github.com/fastblk/csi-fastblk/pkg/driver"
)

const (
	volumeSize       = 64 << 20
	volumeExpandSize = 128 << 20
)

// plugin is one running driver instance with its own data directory.
type plugin struct {
	endpoint string
	base     string
	backend  blockdev.Backend
	kind     string // backend: loop or ublk
	stop     func()
}

func startPlugin(t *testing.T, name string) *plugin {
	t.Helper()
	base, err := os.MkdirTemp("", "fastblk-sanity-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	kind := os.Getenv("FASTBLK_TEST_BACKEND")
	if kind == "" {
		kind = "loop"
	}
	dataDir := filepath.Join(base, "data")
	store, err := store.Open(store.Config{Dir: dataDir, OverProvisionRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	backend, err := backend.New(kind, backend.Config{DataDir: dataDir, DevDir: filepath.Join(base, "dev")})
	if err != nil {
		t.Fatalf("%s backend: %v", kind, err)
	}
	// ControllerExpansion on, so that sanity's ExpandVolume [Controller]
	// specs run too; node-only expansion is covered by pkg/driver's tests.
	drv, err := driver.New(driver.Config{Name: "fastblk.csi.io", Version: "test", NodeID: "sanity-node",
		MaxVolumesPerNode: 64, ControllerExpansion: true}, store, backend)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "csi.sock")
	lis, err := driver.Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- drv.Serve(ctx, lis) }()
	p := &plugin{endpoint: "unix://" + sock, base: base, backend: backend, kind: kind}
	p.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		backend.Close()
	}
	return p
}

func (p *plugin) config(access string) *sanity.TestConfig {
	cfg := sanity.NewTestConfig()
	cfg.Address = p.endpoint
	cfg.TargetPath = filepath.Join(p.base, "target")
	cfg.StagingPath = filepath.Join(p.base, "staging")
	cfg.TestVolumeSize = volumeSize
	cfg.TestVolumeExpandSize = volumeExpandSize
	cfg.TestVolumeAccessType = access
	cfg.IdempotentCount = 3
	cfg.TestNodeVolumeAttachLimit = true
	// Used by the ModifyVolume and VolumeAttributesClass specs. The loop
	// backend cannot enforce rate limits (it refuses them with
	// InvalidArgument) but accepts lifting them, which is what its specs
	// set.
	cfg.TestVolumeMutableParameters = map[string]string{"maxIOPS": "5000", "maxBandwidth": "200Mi"}
	if p.kind == "loop" {
		cfg.TestVolumeMutableParameters = map[string]string{"maxIOPS": "0", "maxBandwidth": "0"}
	}
	// A leftover directory would cascade into every later spec; remove
	// whatever is left, as csi-driver-host-path's harness does.
	cfg.RemoveTargetPath = os.RemoveAll
	cfg.RemoveStagingPath = os.RemoveAll
	return &cfg
}

var suites = map[string]*sanity.TestConfig{}

// TestSanity runs the whole csi-sanity suite twice, against two driver
// instances: one with mount access (ext4) and one with block access.
func TestSanity(t *testing.T) {
	testgate.RequireRoot(t)
	for _, access := range []string{"mount", "block"} {
		p := startPlugin(t, access)
		suites[access] = p.config(access)
		t.Cleanup(func() { checkNoDevicesLeft(t, access, p) })
		t.Cleanup(p.stop)
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "csi-fastblk sanity")
}

// checkNoDevicesLeft proves the suite's cleanup detached everything.
func checkNoDevicesLeft(t *testing.T, access string, p *plugin) {
	devs, err := p.backend.List(context.Background())
	if err != nil {
		t.Errorf("%s: list devices: %v", access, err)
	}
	for _, d := range devs {
		t.Errorf("%s: device %s for volume %s left attached", access, d.Path, d.VolumeID)
		_ = p.backend.Detach(context.Background(), d.VolumeID)
	}
}

var contexts []*sanity.TestContext

var _ = AfterSuite(func() {
	for _, c := range contexts {
		c.Finalize()
	}
})

var _ = Describe("fastblk", func() {
	for _, access := range []string{"mount", "block"} {
		Context(fmt.Sprintf("%s access", access), func() {
			cfg := &sanity.TestConfig{}
			BeforeEach(func() { *cfg = *suites[access] })
			contexts = append(contexts, sanity.GinkgoTest(cfg))
		})
	}
})
