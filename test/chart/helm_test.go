package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// Pinned in hack/chart/lib.sh; kept in step here for the cache lookup.
const (
	helmVersion = "v3.22.0"
	kubeVersion = "1.34.0"
)

// packageDir is this package's directory, where go test starts its tests
// (make test builds with -trimpath, so runtime.Caller names no directory).
var packageDir, packageDirErr = os.Getwd()

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	if packageDirErr != nil {
		t.Fatalf("locate the test package: %v", packageDirErr)
	}
	return filepath.Clean(filepath.Join(packageDir, "..", ".."))
}

// helmPath finds the pinned helm: $HELM, then the cache that
// hack/chart/test.sh fills. Without it the test skips.
func helmPath(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	cache := os.Getenv("CSI_FASTBLK_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			testgate.Skip(t, testgate.Chart, "helm not found: no $HELM and no cache dir (%v); run hack/chart/test.sh", err)
		}
		cache = filepath.Join(base, "csi-fastblk")
	}
	h := filepath.Join(cache, "helm-"+helmVersion, "helm")
	if _, err := os.Stat(h); err != nil {
		testgate.Skip(t, testgate.Chart, "helm %s not built at %s; run hack/chart/test.sh", helmVersion, h)
	}
	return h
}

// helm runs helm with args and returns stdout, stderr and the error.
func helm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helmPath(t), args...)
	cmd.Dir = repoRoot(t)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// templateArgs builds `helm template` arguments for the chart with --set
// pairs.
func templateArgs(set ...string) []string {
	args := []string{"template", "csi-fastblk", "charts/csi-fastblk",
		"--namespace", "csi-fastblk", "--kube-version", kubeVersion}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// render renders the chart with --set pairs and decodes the objects.
func render(t *testing.T, set ...string) []object {
	t.Helper()
	out, stderr, err := helm(t, templateArgs(set...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", set, err, stderr)
	}
	objs, err := decodeObjects([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// find returns the objects of one kind.
func find(objs []object, kind string) []object {
	var r []object
	for _, o := range objs {
		if o.Kind == kind {
			r = append(r, o)
		}
	}
	return r
}

// one returns the single object of a kind or fails.
func one(t *testing.T, objs []object, kind string) object {
	t.Helper()
	f := find(objs, kind)
	if len(f) != 1 {
		t.Fatalf("want one %s, got %d", kind, len(f))
	}
	return f[0]
}

// nodePod returns the DaemonSet's pod template.
func nodePod(t *testing.T, objs []object) podSpec {
	t.Helper()
	var w workload
	if err := one(t, objs, "DaemonSet").decode(&w); err != nil {
		t.Fatal(err)
	}
	return w.Spec.Template.Spec
}
