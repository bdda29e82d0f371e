package blockdev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// Exit statuses of the helper process.
const (
	crashExit     = 75 // killed at the point the test asked for
	refusedExit   = 76 // OpenStore refused the data directory
	helperTimeout = 30 * time.Second
)

// TestHelperProcess is not a test: helper runs this binary again as a
// second plugin process that does FASTBLK_HELPER in FASTBLK_DATA_DIR.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("FASTBLK_DATA_DIR")
	switch os.Getenv("FASTBLK_HELPER") {
	case "":
		t.Skip("helper process for the crash and lock tests")
	case "hold":
		// Open the store, say so, and hold it until stdin closes.
		s, err := OpenStore(StoreConfig{Dir: dir})
		if err != nil {
			fmt.Println(err)
			os.Exit(refusedExit)
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		s.Close()
		os.Exit(0)
	case "attach":
		// Create and attach a volume, then die before the record says
		// so: NodeStageVolume's window between Attach and UpdateNode.
		ctx := context.Background()
		s, err := OpenStore(StoreConfig{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.CreateVolume(ctx, VolumeSpec{Name: os.Getenv("FASTBLK_NAME"), SizeBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewBackend("loop", BackendConfig{DataDir: dir, DevDir: os.Getenv("FASTBLK_DEV_DIR")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Attach(ctx, AttachRequest{VolumeID: v.ID, File: s.VolumeFile(v.ID), SizeBytes: v.SizeBytes}); err != nil {
			t.Fatal(err)
		}
		os.Exit(crashExit)
	}
}

// helper starts the helper process doing what in dataDir, with env added.
func helper(t *testing.T, what, dataDir string, env ...string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout="+helperTimeout.String())
	cmd.Env = append(append(os.Environ(), "FASTBLK_HELPER="+what, "FASTBLK_DATA_DIR="+dataDir), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdin, bufio.NewReader(stdout)
}

// exitCode waits for cmd and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode()
}

// TestDataDirLockedAcrossProcesses proves that two plugin processes never
// share a data directory: a second process is refused while the first
// holds it, with an error naming the holder, and gets it once the first
// has exited. Stores opened twice in one process (a restart in a test)
// share the lock.
func TestDataDirLockedAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	openStore(t, dir).Close()

	cmd, stdin, out := helper(t, "hold", dir)
	stdin.Close()
	line, _ := out.ReadString('\n')
	if code := exitCode(t, cmd); code != refusedExit || !strings.Contains(line, "in use") {
		t.Fatalf("second process on a held data directory: exit %d, %q; want refused as in use", code, line)
	}
	t.Logf("second process refused: %s", strings.TrimSpace(line))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	cmd, stdin, out = helper(t, "hold", dir)
	if line, _ := out.ReadString('\n'); line != "locked\n" {
		stdin.Close()
		t.Fatalf("helper: %q", line)
	}
	_, err := OpenStore(StoreConfig{Dir: dir})
	if !errors.Is(err, ErrBusy) {
		t.Errorf("OpenStore while another process holds the directory = %v, want ErrBusy", err)
	}
	stdin.Close()
	if code := exitCode(t, cmd); code != 0 {
		t.Fatalf("helper exit %d", code)
	}
	openStore(t, dir).Close()
}

// TestDeleteVolumeDetachesLeftoverDevice kills the plugin between attaching
// a volume's loop device and recording it (NodeStageVolume's window), then
// proves that DeleteVolume in the restarted plugin detaches that device
// before it removes the file, that the retried DeleteVolume is a no-op, and
// that a new volume of the same name is served from its own file.
func TestDeleteVolumeDetachesLeftoverDevice(t *testing.T) {
	requireRoot(t)
	dir, devDir := t.TempDir(), t.TempDir()
	const name = "pvc-crash"
	file := ""
	t.Cleanup(func() {
		found, _ := loop.Find(file)
		for _, d := range found {
			loop.Detach(d.Path, detachTimeout)
		}
	})
	cmd, stdin, _ := helper(t, "attach", dir, "FASTBLK_NAME="+name, "FASTBLK_DEV_DIR="+devDir)
	stdin.Close()
	if code := exitCode(t, cmd); code != crashExit {
		t.Fatalf("helper exit %d, want %d (killed after Attach)", code, crashExit)
	}

	ctx := context.Background()
	s := openStore(t, dir)
	id := VolumeID(name)
	file = s.VolumeFile(id)
	if found, err := loop.Find(file); err != nil || len(found) != 1 {
		t.Fatalf("after the crash: devices %+v, %v; want the one left behind", found, err)
	}
	b, err := NewBackend("loop", BackendConfig{DataDir: dir, DevDir: devDir})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.DeleteVolume(ctx, id, b.Detach); err != nil {
			t.Fatal(err)
		}
		if found, _ := loop.Find(file); len(found) != 0 {
			t.Fatalf("after DeleteVolume the deleted file is still served: %+v", found)
		}
	}
	v := mustCreate(t, s, VolumeSpec{Name: name, SizeBytes: 8 << 20})
	d, err := b.Attach(ctx, AttachRequest{VolumeID: v.ID, File: file, SizeBytes: v.SizeBytes})
	if err != nil {
		t.Fatal(err)
	}
	if found, _ := loop.Find(file); len(found) != 1 || found[0].Deleted || found[0].Path != d.Path {
		t.Fatalf("devices of the new volume %+v, want only %s on the new file", found, d.Path)
	}
	if err := b.Detach(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
}
