package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/owner"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// Exit statuses of the helper process.
const (
	crashExit     = 75 // killed at the point the test asked for
	refusedExit   = 76 // Open refused the data directory
	helperTimeout = 30 * time.Second
)

// TestHelperProcess is not a test: helper runs this binary again as a
// second plugin process that does FASTBLK_HELPER in FASTBLK_DATA_DIR.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("FASTBLK_DATA_DIR")
	switch os.Getenv("FASTBLK_HELPER") {
	case "":
		return // not a helper: run by the crash and lock tests only
	case "hold":
		// Open the store, say so, and hold it until stdin closes.
		s, err := Open(Config{Dir: dir})
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
		s, err := Open(Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.CreateVolume(ctx, VolumeSpec{Name: os.Getenv("FASTBLK_NAME"), SizeBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		b, err := backend.New(os.Getenv("FASTBLK_BACKEND"), backend.Config{DataDir: dir, DevDir: os.Getenv("FASTBLK_DEV_DIR")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Attach(ctx, blockdev.AttachRequest{VolumeID: v.ID, File: s.VolumeFile(v.ID), SizeBytes: v.SizeBytes}); err != nil {
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
	_, err := Open(Config{Dir: dir})
	if !errors.Is(err, blockdev.ErrBusy) {
		t.Errorf("Open while another process holds the directory = %v, want ErrBusy", err)
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
	testgate.RequireRoot(t)
	testDeleteDetachesLeftover(t, "loop", func(file string) int {
		found, err := loop.Find(file)
		if err != nil {
			t.Fatal(err)
		}
		return len(found)
	})
}

// TestUblkBackendDeleteVolumeDetachesLeftoverDevice is the same on ublk (in
// the VM): the device left behind is re-adopted at the restart, and
// DeleteVolume deletes it.
func TestUblkBackendDeleteVolumeDetachesLeftoverDevice(t *testing.T) {
	testgate.RequireRoot(t)
	testgate.RequireUblk(t)
	testDeleteDetachesLeftover(t, "ublk", func(file string) int {
		ctl, err := ublk.OpenControl()
		if err != nil {
			t.Fatal(err)
		}
		defer ctl.Close()
		ids, err := ublk.ListIDs()
		if err != nil {
			t.Fatal(err)
		}
		tok, err := owner.Ensure(filepath.Dir(filepath.Dir(file)))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, id := range ids {
			info, err := ctl.GetDevInfo(id)
			// A deleted device lingers until its last user goes; a
			// stopped one serves nothing.
			if err == nil && info.UblksrvFlags == tok && info.State != ublk.StateDead {
				n++
			}
		}
		return n
	})
}

// testDeleteDetachesLeftover runs the crash window on backend kind;
// serving counts the devices still serving a volume file.
func testDeleteDetachesLeftover(t *testing.T, kind string, serving func(file string) int) {
	dir, devDir := t.TempDir(), t.TempDir()
	const name = "pvc-crash"
	cmd, stdin, _ := helper(t, "attach", dir, "FASTBLK_NAME="+name, "FASTBLK_DEV_DIR="+devDir, "FASTBLK_BACKEND="+kind)
	stdin.Close()
	if code := exitCode(t, cmd); code != crashExit {
		t.Fatalf("helper exit %d, want %d (killed after Attach)", code, crashExit)
	}

	ctx := context.Background()
	s := openStore(t, dir)
	id := blockdev.VolumeID(name)
	file := s.VolumeFile(id)
	b, err := backend.New(kind, backend.Config{DataDir: dir, DevDir: devDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Detach(ctx, id)
		b.Close()
	})
	if n := serving(file); n != 1 {
		t.Fatalf("after the crash: %d devices, want the one left behind", n)
	}
	for range 2 {
		if err := s.DeleteVolume(ctx, id, b.Detach); err != nil {
			t.Fatal(err)
		}
		if n := serving(file); n != 0 {
			t.Fatalf("after DeleteVolume %d devices still serve the deleted file", n)
		}
	}
	v := mustCreate(t, s, VolumeSpec{Name: name, SizeBytes: 8 << 20})
	d, err := b.Attach(ctx, blockdev.AttachRequest{VolumeID: v.ID, File: file, SizeBytes: v.SizeBytes})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := b.List(ctx); err != nil || len(l) != 1 || l[0].Path != d.Path || serving(file) != 1 {
		t.Fatalf("devices of the new volume %+v, %v; want only %s", l, err, d.Path)
	}
	if err := b.Detach(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
}
