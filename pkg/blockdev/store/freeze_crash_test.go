package store

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
)

// Environment of the child process TestCrashWhileFrozen re-executes.
const (
	crashChildEnv = "FASTBLK_TEST_FROZEN_CHILD" // data dir, volume ID, mount path, device
)

// liveVolume is a volume attached on a loop device with ext4 mounted on it.
type liveVolume struct {
	s   *Store
	v   blockdev.Volume
	dev string // the stable device link
	mnt string
}

// mountVolume creates a volume of size bytes in s, attaches it, makes ext4
// on it (initialised at once, so no background writer runs later) and
// mounts it. Everything is undone in t.Cleanup.
func mountVolume(t testing.TB, s *Store, name string, size int64) liveVolume {
	t.Helper()
	testgate.RequireLoop(t)
	testgate.RequireTool(t, "mkfs.ext4")
	ctx := context.Background()
	v := mustCreate(t, s, VolumeSpec{Name: name, SizeBytes: size})
	b, err := backend.New("loop", backend.Config{DataDir: s.Dir(), DevDir: filepath.Join(s.Dir(), "dev")})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := b.Attach(ctx, blockdev.AttachRequest{VolumeID: v.ID, File: s.VolumeFile(v.ID), SizeBytes: v.SizeBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Detach(ctx, v.ID); err != nil {
			t.Error(err)
		}
	})
	testfs.Run(t, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev.Link)
	mnt := t.TempDir()
	if err := unix.Mount(dev.Path, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return liveVolume{s: s, v: v, dev: dev.Link, mnt: mnt}
}

// isFrozen reports whether the filesystem at mnt is frozen, without
// blocking: FIFREEZE of a frozen filesystem fails with EBUSY.
func isFrozen(t *testing.T, mnt string) bool {
	t.Helper()
	thaw, err := quiesce.FreezeFS(context.Background(), mnt)
	if errors.Is(err, blockdev.ErrBusy) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestCrashWhileFrozen kills a process in the middle of a snapshot, while
// it holds the source volume's filesystem frozen, and proves that the next
// start thaws that filesystem, forgets the intent and the half-made
// snapshot, and that pod writes then go through.
func TestCrashWhileFrozen(t *testing.T) {
	if env := os.Getenv(crashChildEnv); env != "" {
		frozenChild(env) // never returns
	}
	testgate.RequireRoot(t)
	data := t.TempDir()
	lv := mountVolume(t, openStore(t, data), "live", 64<<20)
	// The child is the plugin now: it takes the data directory's lock.
	if err := lv.s.Close(); err != nil {
		t.Fatal(err)
	}

	child, out := startChild(t, "TestCrashWhileFrozen", crashChildEnv, []string{data, lv.v.ID, lv.mnt, lv.dev}, lv.mnt)
	waitLine(t, out, "frozen")
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	if !isFrozen(t, lv.mnt) {
		t.Fatal("the filesystem is not frozen after the kill: the test did not reach its window")
	}

	s := restartStore(t, data)

	if isFrozen(t, lv.mnt) {
		t.Fatalf("%s is still frozen after the plugin restarted: every pod write to it hangs", lv.mnt)
	}
	if err := writeWithin(filepath.Join(lv.mnt, "after"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, frozenDir)); len(ents) != 0 {
		t.Errorf("freeze records left after the thaw: %v", ents)
	}
	if snaps := s.Snapshots(); len(snaps) != 0 {
		t.Errorf("half-made snapshot survived the crash: %v", snaps)
	}
	if _, err := os.Stat(s.dataFile(blockdev.SnapshotID("snap"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-made snapshot file: %v, want it removed", err)
	}
}

// startChild runs this test binary's test (whose child part reads the
// variable env, holding args one a line) as the process a crash test
// kills, and returns it with its stdout. Cleanup kills it if need be and
// thaws the mounts, never leaving the host with a frozen filesystem.
func startChild(t *testing.T, test, env string, args []string, mounts ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	child.Env = append(os.Environ(), env+"="+strings.Join(args, "\n"))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
		for _, mnt := range mounts {
			unfreeze(mnt)
		}
	})
	return child, out
}

// frozenChild is the process TestCrashWhileFrozen kills: it starts a
// snapshot of the mounted volume and, once the filesystem is frozen,
// reports "frozen" and waits to be killed.
func frozenChild(env string) {
	args := strings.Split(env, "\n")
	data, id, mnt, dev := args[0], args[1], args[2], args[3]
	s, err := Open(Config{Dir: data})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	q := func(ctx context.Context) (func() error, error) {
		thaw, err := quiesce.FreezeVolume(ctx, s.Dir(), id, mnt, dev)
		if err != nil {
			return nil, err
		}
		fmt.Println("frozen")
		time.Sleep(time.Hour) // killed here
		return thaw, nil
	}
	_, err = s.CreateSnapshot(context.Background(), "snap", id, q)
	fmt.Fprintln(os.Stderr, "snapshot returned:", err)
	os.Exit(3)
}

// restartStore opens the data directory as the plugin does when it starts.
func restartStore(t *testing.T, dir string) *Store {
	t.Helper()
	s := openStore(t, dir)
	if _, err := quiesce.ThawAbandoned(s.Dir()); err != nil {
		t.Fatalf("thaw at start: %v", err)
	}
	return s
}

func waitLine(t *testing.T, r interface{ Read([]byte) (int, error) }, want string) {
	t.Helper()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited before printing %q", want)
			}
			if l == want {
				return
			}
		case <-timeout:
			t.Fatalf("child did not print %q within 60s", want)
		}
	}
}

// writeWithin creates file and fsyncs it, failing if that takes longer
// than d (a write into a frozen filesystem blocks until it is thawed).
func writeWithin(file string, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(file, []byte(strconv.Itoa(os.Getpid())), 0o600) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("write to %s blocked for %v: the filesystem is frozen", file, d)
	}
}

// unfreeze thaws the filesystem at mnt if it is frozen (fsfreeze -u, whose
// FITHAW of one that is not frozen fails harmlessly).
func unfreeze(mnt string) {
	exec.Command("fsfreeze", "-u", mnt).Run()
}

// TestFreezeRefusesAnotherFilesystem proves the store freezes only the
// filesystem on the volume's own device: a recorded staging path that holds
// another filesystem (the volume's mount gone after a reboot, the path now
// a directory of the host) is refused and left unfrozen. The stand-in for
// the host's filesystem is an ext4 image of its own, so that a failure
// freezes nothing that matters.
func TestFreezeRefusesAnotherFilesystem(t *testing.T) {
	s := openStore(t, t.TempDir())
	lv := mountVolume(t, s, "vol", 64<<20)
	other := testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	thaw, err := quiesce.FreezeVolume(context.Background(), s.Dir(), lv.v.ID, other, lv.dev)
	if err == nil {
		thaw()
		t.Fatalf("FreezeFS froze %s, which is not on the volume's device %s", other, lv.dev)
	}
	if isFrozen(t, other) {
		unfreeze(other)
		t.Fatalf("%s was left frozen", other)
	}
	if !errors.Is(err, blockdev.ErrBusy) {
		t.Errorf("FreezeFS of another filesystem = %v, want ErrBusy", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), frozenDir)); len(ents) != 0 {
		t.Errorf("freeze records left after a refused freeze: %v", ents)
	}
}

// TestThawAbandonedRecords covers the records a start may find besides a
// frozen volume: one whose filesystem is no longer frozen, one whose mount
// path now holds another filesystem (frozen by someone else, which must
// stay frozen), and one that cannot be read (kept, and reported).
func TestThawAbandonedRecords(t *testing.T) {
	s := openStore(t, t.TempDir())
	other := testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	var st unix.Stat_t
	if err := unix.Stat(other, &st); err != nil {
		t.Fatal(err)
	}
	write := func(rec quiesce.FreezeRecord) {
		data, err := json.Marshal(rec)
		if err == nil {
			err = os.MkdirAll(filepath.Join(s.Dir(), frozenDir), 0o700)
		}
		if err == nil {
			err = os.WriteFile(freezeRecordPath(s.Dir(), rec.VolumeID), data, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Run("not frozen", func(t *testing.T) {
		write(quiesce.FreezeRecord{VolumeID: blockdev.VolumeID("a"), MountPath: other, Dev: st.Dev})
		thawed, err := quiesce.ThawAbandoned(s.Dir())
		if err != nil || len(thawed) != 0 {
			t.Fatalf("ThawAbandoned = %v, %v; want nothing thawed, no error", thawed, err)
		}
		if _, err := os.Stat(freezeRecordPath(s.Dir(), blockdev.VolumeID("a"))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("record of a thawed filesystem kept: %v", err)
		}
	})
	t.Run("another filesystem", func(t *testing.T) {
		thaw, err := quiesce.FreezeFS(context.Background(), other) // someone else's freeze
		if err != nil {
			t.Fatal(err)
		}
		defer thaw()
		write(quiesce.FreezeRecord{VolumeID: blockdev.VolumeID("b"), MountPath: other, Dev: unix.Mkdev(7, 9999)})
		if _, err := quiesce.ThawAbandoned(s.Dir()); err != nil {
			t.Fatal(err)
		}
		if !isFrozen(t, other) {
			t.Fatal("ThawAbandoned thawed a filesystem its record does not name")
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		bad := freezeRecordPath(s.Dir(), blockdev.VolumeID("c"))
		if err := os.WriteFile(bad, []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := quiesce.ThawAbandoned(s.Dir()); err == nil {
			t.Error("ThawAbandoned of an unreadable record returned no error")
		}
		if _, err := os.Stat(bad); err != nil {
			t.Errorf("unreadable record removed (%v): it must stay for an operator", err)
		}
	})
}

// frozenDir and freezeRecordPath name the freeze records package quiesce
// keeps in the data directory, as a restarted plugin finds them.
const frozenDir = "frozen"

func freezeRecordPath(dataDir, volumeID string) string {
	return filepath.Join(dataDir, frozenDir, volumeID+".json")
}
