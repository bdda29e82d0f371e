package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDeployIsFresh renders deploy/ again into a temporary directory with the
// same script as `make deploy` and compares it with the committed files.
func TestDeployIsFresh(t *testing.T) {
	root := repoRoot(t)
	tmp := t.TempDir()
	cmd := exec.Command("bash", "-c", `set -euo pipefail; . hack/chart/lib.sh; HELM="$1"; render_deploy "$2"`,
		"render", helmPath(t), tmp)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ROOT="+root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render deploy: %v\n%s", err, out)
	}
	fresh, err := filepath.Glob(filepath.Join(tmp, "*.yaml"))
	if err != nil || len(fresh) == 0 {
		t.Fatalf("render produced no manifests (%v)", err)
	}
	committed, err := filepath.Glob(filepath.Join(root, "deploy", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(committed) != len(fresh) {
		t.Errorf("deploy/ has %d manifests, a fresh render %d: run make deploy", len(committed), len(fresh))
	}
	for _, f := range fresh {
		name := filepath.Base(f)
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(root, "deploy", name))
		if err != nil {
			t.Errorf("deploy/%s: %v: run make deploy", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/%s is out of date with charts/csi-fastblk: run make deploy", name)
		}
		if _, err := decodeObjects(got); err != nil {
			t.Errorf("deploy/%s: %v", name, err)
		}
	}
}
