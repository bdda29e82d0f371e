package dataplane

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

func TestTouchMtimeSetsMtimeAndLeavesAtime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "backing")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	if err := touchMtime(int(f.Fd())); err != nil {
		t.Fatalf("touchMtime: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if mtime := time.Unix(st.Mtim.Unix()); mtime.Before(before) {
		t.Errorf("mtime %v, want about now", mtime)
	}
	if atime := time.Unix(st.Atim.Unix()); !atime.Equal(old) {
		t.Errorf("atime %v, want it left at %v", atime, old)
	}
	if err := touchMtime(-1); err != unix.EBADF {
		t.Errorf("touchMtime(-1) = %v, want EBADF", err)
	}
}

// TestNowaitWriteAfterTouchMtime checks, on the real kernel, the premise of
// the queue's write path (nowaitTries): once touchMtime has brought a stale
// mtime to now, a direct write with RWF_NOWAIT goes through without
// blocking. Whether the kernel refused the write over the stale mtime
// first (ext4 in 7.x does, -EAGAIN; 6.12's updates the time inline) is
// logged, and StaleMtimeRefusesNowait, which the Server uses to turn
// NowaitWrites on, must give the same answer.
func TestNowaitWriteAfterTouchMtime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "backing")
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
	if err == unix.EINVAL {
		testgate.Skip(t, testgate.ODirect, "%s: no O_DIRECT on this filesystem", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ring, err := uring.New(uring.Config{Entries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	bufs, err := uring.NewBuffers(1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer bufs.Close()
	// A block already written: a write to a hole needs an allocation,
	// which NOWAIT refuses whatever the mtime.
	if _, err := unix.Pwrite(fd, bufs.Slot(0), 0); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	write := func() int32 {
		sqe := ring.GetSQE()
		sqe.PrepWrite(int32(fd), bufs.Slot(0), 0)
		sqe.OpFlags = unix.RWF_NOWAIT
		if _, err := ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		var cqes [1]uring.CQE
		if ring.Reap(cqes[:]) != 1 {
			t.Fatal("no completion")
		}
		return cqes[0].Res
	}

	res := write()
	switch res {
	case -int32(unix.EAGAIN):
		t.Log("the kernel refused the write over a stale mtime: -EAGAIN")
	case 4096:
		t.Log("the kernel took the write over a stale mtime")
	default:
		t.Fatalf("write over a stale mtime with RWF_NOWAIT = %d, want 4096 or -EAGAIN", res)
	}
	probed, err := StaleMtimeRefusesNowait(dir)
	if err != nil {
		t.Fatalf("StaleMtimeRefusesNowait: %v", err)
	}
	if refused := res < 0; probed != refused {
		t.Errorf("StaleMtimeRefusesNowait(%s) = %v, but the io_uring write was refused: %v", dir, probed, refused)
	}
	// A clock tick between the touch and the write makes the mtime stale
	// again; a few tries see one without.
	for try := 1; ; try++ {
		if err := touchMtime(fd); err != nil {
			t.Fatal(err)
		}
		if res := write(); res == 4096 {
			break
		} else if res != -int32(unix.EAGAIN) || try == 10 {
			t.Fatalf("write %d after touchMtime = %d, want 4096", try, res)
		}
	}
}

func TestStaleMtimeRefusesNowaitReportsAMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	if refuses, err := StaleMtimeRefusesNowait(dir); err == nil || refuses {
		t.Fatalf("StaleMtimeRefusesNowait(%s) = %v, %v; want an error", dir, refuses, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(dir)); len(entries) != 0 {
		t.Fatalf("the probe left %d entries behind", len(entries))
	}
}

// TestFreshenMtimeNeverBlocksTheThread proves that a queue keeping its
// backing file's mtime current (NowaitWrites) never waits for the file's
// filesystem on the server thread: with the filesystem frozen, utimensat
// waits until the thaw, and freshenMtime must return at once all the same
// (the update happens off the thread; the writes meanwhile are refused and
// go to io-wq). Before, the thread made the utimensat itself and stopped
// serving every device until the thaw. Host test: root, an ext4 file
// system on a loop device, frozen with FIFREEZE.
func TestFreshenMtimeNeverBlocksTheThread(t *testing.T) {
	fs := testfs.MountFreezable(t)
	f, err := os.Create(filepath.Join(fs.Dir, "backing"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q := &Queue{cfg: QueueConfig{Target: FileTarget(int(f.Fd())), Options: QueueOptions{NowaitWrites: true}}}
	l := newQueueState(q)
	l.s = &threadLoop{round: 1}
	// Before the unmount (cleanups run after the thaw below): the update
	// goroutine holds a dup of the file until it has ended.
	t.Cleanup(func() { l.mtime.Close(); <-l.mtime.done })
	fs.Freeze(t)
	thawed := time.AfterFunc(3*time.Second, func() { fs.Thaw(t) })
	defer func() {
		if thawed.Stop() {
			fs.Thaw(t)
		}
	}()
	start := time.Now()
	l.freshenMtime()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("freshenMtime took %v on a frozen filesystem: the server thread waited for it", took)
	}
	if got := q.stats.mtimeUpdates.Load(); got != 1 {
		t.Errorf("mtime updates asked: %d, want 1", got)
	}
}
