package ublk

import (
	"os"
	"slices"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// TestHandoverIsConsumedOnce: the change record Close leaves in a device's
// state file starts the re-adopted device's record, trusted, and is gone
// from the file before the device serves again; without one, or when the
// file cannot be rewritten, the record starts untrusted.
func TestHandoverIsConsumedOnce(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: ServerConfig{StateDir: dir}}
	st := validState(dir, "v0123456789abcdef0123456789abcdef")
	handed := []cbt.Extent{{Offset: 0, Length: cbt.Granularity}, {Offset: 10 * cbt.Granularity, Length: cbt.Granularity}}
	st.Handover = &Changes{Extents: handed, Trusted: true}
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}
	read, err := readState(dir, st.VolumeID+stateSuffix)
	if err != nil || read.Handover == nil || !slices.Equal(read.Handover.Extents, handed) {
		t.Fatalf("state read back = %+v, %v", read, err)
	}
	tr, rest, err := s.takeHandover(read)
	if err != nil {
		t.Fatal(err)
	}
	if rest.Handover != nil {
		t.Fatal("state still carries the hand-over")
	}
	if again, _ := readState(dir, st.VolumeID+stateSuffix); again.Handover != nil {
		t.Fatal("state file still carries the hand-over: a crash later would trust it")
	}
	if exts, trusted := tr.Cut(); !trusted || !slices.Equal(exts, handed) {
		t.Fatalf("re-adopted record = %v %v, want %v trusted", exts, trusted, handed)
	}

	t.Run("no hand-over: untrusted", func(t *testing.T) {
		tr, _, err := s.takeHandover(rest)
		if err != nil {
			t.Fatal(err)
		}
		if _, trusted := tr.Cut(); trusted {
			t.Fatal("a record without a hand-over is trusted")
		}
	})
	t.Run("a hand-over that cannot be removed is not used", func(t *testing.T) {
		bad := &Server{cfg: ServerConfig{StateDir: dir + "/missing"}}
		if err := os.RemoveAll(dir + "/missing"); err != nil {
			t.Fatal(err)
		}
		tr, _, err := bad.takeHandover(read)
		if err != nil {
			t.Fatal(err)
		}
		if exts, trusted := tr.Cut(); trusted || len(exts) != 0 {
			t.Fatalf("record = %v %v, want empty and untrusted", exts, trusted)
		}
	})
}
