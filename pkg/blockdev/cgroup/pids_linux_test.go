package cgroup

import (
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestReadPidsMax(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		content string
		want    int64
		bad     bool
	}{{"max\n", -1, false}, {"1234\n", 1234, false}, {"lots\n", 0, true}} {
		f := filepath.Join(dir, "pids.max")
		if err := os.WriteFile(f, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := readPidsMax(f)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("readPidsMax(%q) = %d, %v; want %d (error %v)", c.content, got, err, c.want, c.bad)
		}
	}
	if got, err := readPidsMax(filepath.Join(dir, "missing")); got != -1 || err != nil {
		t.Errorf("a missing pids.max = %d, %v; want -1 (no limit)", got, err)
	}
}

// TestPidsLimitOfRealCgroup puts a child process in a real pids cgroup with
// pids.max 77 and a nested one without a limit, and proves that PidsLimit
// finds the ancestor's limit and PidsHeadroom what is left of it.
func TestPidsLimitOfRealCgroup(t *testing.T) {
	testgate.RequireRoot(t)
	root := pidsHierarchy(t)
	outer := filepath.Join(root, "csi-fastblk-test-"+strconv.Itoa(os.Getpid()))
	inner := filepath.Join(outer, "inner")
	for _, d := range []string{outer, inner} {
		if err := os.Mkdir(d, 0o755); err != nil {
			testgate.Skip(t, testgate.Cgroup, "cannot create a pids cgroup here: %v", err)
		}
	}
	child := exec.Command("sleep", "60")
	t.Cleanup(func() {
		if child.Process != nil {
			child.Process.Kill()
			child.Wait()
		}
		os.Remove(inner)
		os.Remove(outer)
	})
	if err := os.WriteFile(filepath.Join(outer, "pids.max"), []byte("77"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inner, "cgroup.procs"), []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move child into the cgroup: %v", err)
	}
	got, err := PidsLimit(child.Process.Pid)
	if err != nil || got != 77 {
		t.Fatalf("PidsLimit = %d, %v; want 77 (the parent cgroup's pids.max)", got, err)
	}
	// The child is the only task under the limit: room for 76 more; a
	// second child in the inner cgroup takes one of them.
	if got, err := PidsHeadroom(child.Process.Pid); err != nil || got != 76 {
		t.Fatalf("PidsHeadroom = %d, %v; want 76 (77 minus the child)", got, err)
	}
	second := exec.Command("sleep", "60")
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { second.Process.Kill(); second.Wait() }()
	if err := os.WriteFile(filepath.Join(inner, "cgroup.procs"), []byte(strconv.Itoa(second.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move the second child into the cgroup: %v", err)
	}
	if got, err := PidsHeadroom(child.Process.Pid); err != nil || got != 75 {
		t.Fatalf("PidsHeadroom with two children = %d, %v; want 75", got, err)
	}
	if _, err := PidsLimit(os.Getpid()); err != nil {
		t.Fatalf("PidsLimit of this process: %v", err)
	}
	if _, err := PidsHeadroom(os.Getpid()); err != nil {
		t.Fatalf("PidsHeadroom of this process: %v", err)
	}
}

// pidsHierarchy returns the directory of the pids controller's root: v1's
// pids hierarchy, or v2's when it has the controller enabled for children.
func pidsHierarchy(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(Root, "pids", "cgroup.procs")); err == nil {
		return filepath.Join(Root, "pids")
	}
	b, err := os.ReadFile(filepath.Join(Root, "cgroup.subtree_control"))
	if err == nil && strings.Contains(string(b), "pids") {
		return Root
	}
	testgate.Skip(t, testgate.Cgroup, "no pids controller to test with")
	return ""
}

func TestTighterLimit(t *testing.T) {
	for _, c := range [][3]int64{{-1, -1, -1}, {-1, 5, 5}, {5, -1, 5}, {5, 3, 3}, {3, 5, 3}} {
		if got := tighter(c[0], c[1]); got != c[2] {
			t.Errorf("tighter(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
}
