package ublk

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// handedOver writes a volume file of 1 MiB in dir and a state whose
// hand-over of exts was made of it as it is (stamped as handOver stamps),
// and returns the state and the open file.
func handedOver(t *testing.T, dir string, exts []cbt.Extent) (State, *os.File) {
	t.Helper()
	file := filepath.Join(dir, "vol.img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ino, ctime, err := stamp(f)
	if err != nil {
		t.Fatal(err)
	}
	st := validState(dir, "v0123456789abcdef0123456789abcdef")
	st.File = file
	st.Handover = &Handover{Changes: Changes{Extents: exts, Trusted: true}, Inode: ino, Ctime: ctime}
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}
	read, err := readState(dir, st.VolumeID+stateSuffix)
	if err != nil || read.Handover == nil || !slices.Equal(read.Handover.Extents, exts) || read.Handover.Inode != ino {
		t.Fatalf("state read back = %+v, %v", read, err)
	}
	return read, f
}

// TestHandoverIsConsumedOnce: the change record a stopping process leaves
// in a device's state file starts the re-adopted device's record,
// trusted, and is gone from the file before the device serves again;
// without one, or when the file cannot be rewritten, the record starts
// untrusted.
func TestHandoverIsConsumedOnce(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: ServerConfig{StateDir: dir}}
	handed := []cbt.Extent{{Offset: 0, Length: cbt.Granularity}, {Offset: 10 * cbt.Granularity, Length: cbt.Granularity}}
	read, f := handedOver(t, dir, handed)
	tr, rest, err := s.takeHandover(read, f)
	if err != nil {
		t.Fatal(err)
	}
	if rest.Handover != nil {
		t.Fatal("state still carries the hand-over")
	}
	if again, _ := readState(dir, read.VolumeID+stateSuffix); again.Handover != nil {
		t.Fatal("state file still carries the hand-over: a crash later would trust it")
	}
	if exts, trusted := tr.Cut(); !trusted || !slices.Equal(exts, handed) {
		t.Fatalf("re-adopted record = %v %v, want %v trusted", exts, trusted, handed)
	}

	t.Run("no hand-over: untrusted", func(t *testing.T) {
		tr, _, err := s.takeHandover(rest, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, trusted := tr.Cut(); trusted {
			t.Fatal("a record without a hand-over is trusted")
		}
	})
	t.Run("a hand-over that cannot be removed is not used", func(t *testing.T) {
		bad := &Server{cfg: ServerConfig{StateDir: dir + "/missing"}}
		tr, _, err := bad.takeHandover(read, f)
		if err != nil {
			t.Fatal(err)
		}
		if exts, trusted := tr.Cut(); trusted || len(exts) != 0 {
			t.Fatalf("record = %v %v, want empty and untrusted", exts, trusted)
		}
	})
	t.Run("a hand-over without a stamp (an older plugin's) is not used", func(t *testing.T) {
		old := read
		old.Handover = &Handover{Changes: read.Handover.Changes}
		tr, _, err := s.takeHandover(old, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, trusted := tr.Cut(); trusted {
			t.Fatal("an unstamped hand-over is trusted")
		}
	})
}

// TestHandoverVoidedByWritesItNeverSaw: a hand-over that a process could
// not remove from the state file (it served the device with an untrusted
// record) must not be trusted by a later process once that one wrote to
// the volume: the writes are in no record. Untouched, it still is.
func TestHandoverVoidedByWritesItNeverSaw(t *testing.T) {
	dir := t.TempDir()
	handed := []cbt.Extent{{Offset: 0, Length: cbt.Granularity}}
	read, f := handedOver(t, dir, handed)

	// The next process cannot remove it (its state directory is gone
	// from under it): it serves with an untrusted record.
	bad := &Server{cfg: ServerConfig{StateDir: filepath.Join(dir, "missing")}}
	tr, _, err := bad.takeHandover(read, f)
	if err != nil {
		t.Fatal(err)
	}
	if _, trusted := tr.Cut(); trusted {
		t.Fatal("a hand-over that could not be removed was trusted")
	}
	// It dies before writing: the process after it may trust the
	// hand-over, which still holds every change.
	s := &Server{cfg: ServerConfig{StateDir: dir}}
	again, err := readState(dir, read.VolumeID+stateSuffix)
	if err != nil || again.Handover == nil {
		t.Fatalf("state read back = %+v, %v", again, err)
	}
	if err := saveState(dir, again); err != nil { // kept for the next case
		t.Fatal(err)
	}
	tr, _, err = s.takeHandover(again, f)
	if err != nil {
		t.Fatal(err)
	}
	if exts, trusted := tr.Cut(); !trusted || !slices.Equal(exts, handed) {
		t.Fatalf("untouched since, the hand-over gave %v trusted %t, want %v trusted", exts, trusted, handed)
	}

	// This time it writes, then dies; the process after it finds the
	// hand-over still there.
	if err := saveState(dir, again); err != nil {
		t.Fatal(err)
	}
	if _, _, err := bad.takeHandover(again, f); err != nil {
		t.Fatal(err)
	}
	// A process writes long after the stamp; here the clock is let pass
	// one tick of the kernel's coarse timestamps first.
	time.Sleep(20 * time.Millisecond)
	if _, err := f.WriteAt([]byte("written by a process that trusted nothing"), 512<<10); err != nil {
		t.Fatal(err)
	}
	tr, _, err = s.takeHandover(again, f)
	if err != nil {
		t.Fatal(err)
	}
	if exts, trusted := tr.Cut(); trusted {
		t.Fatalf("a later process trusted the hand-over %v after writes it never saw (at 512 KiB)", exts)
	}
}
