package ublk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// TestServerRecordsChanges writes, discards and zeroes ranges of a live
// device with O_DIRECT and the block ioctls and reads them back from the
// device's change record: per cut, handed over by a detach, carried into
// the next device, and untrusted for a re-adopted one without a
// hand-over (the VM runs it, hack/vm step 46).
func TestServerRecordsChanges(t *testing.T) {
	needUblk(t)
	dir := scratchDir(t)
	file := sparseFile(t, dir, "vol.img", 64<<20)
	state := filepath.Join(dir, "state")
	// A failure leaves the device released for re-adoption, which would
	// count against the tests after this one: remove it.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if s, _, err := NewServer(context.Background(), ServerConfig{StateDir: state}); err == nil {
			s.Detach(context.Background(), "vol")
			s.Close()
		}
	})
	s := newTestServer(t, state)
	defer func() { s.Close() }()
	ctx := context.Background()
	const g = cbt.Granularity
	// cut cuts the record with the device's I/O held, as a snapshot does.
	cut := func() (Changes, error) {
		t.Helper()
		resume, err := s.Pause(ctx, "vol")
		if err != nil {
			t.Fatal(err)
		}
		defer resume()
		return s.CutChanges("vol")
	}
	carry := []cbt.Extent{{Offset: 60 << 20, Length: g}}
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file, Changes: carry, ChangesTrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 1<<20, 1, true) // 256 KiB: 4 chunks
	if _, err := s.CutChanges("vol"); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("cut with the device's i/o not held: %v, want an error wrapping os.ErrInvalid", err)
	}
	ch, err := cut()
	if err != nil {
		t.Fatal(err)
	}
	if want := []cbt.Extent{{Offset: 1 << 20, Length: 4 * g}, {Offset: 60 << 20, Length: g}}; !ch.Trusted || !slices.Equal(ch.Extents, want) {
		t.Fatalf("first cut = %+v, want %v trusted", ch, want)
	}
	f, err := os.OpenFile(d.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ioctlRange(f, unix.BLKDISCARD, &[2]uint64{8 << 20, 1 << 20}); err != nil {
		t.Fatalf("discard: %v", err)
	}
	if err := ioctlRange(f, unix.BLKZEROOUT, &[2]uint64{16 << 20, 2 * g}); err != nil {
		t.Fatalf("zero out: %v", err)
	}
	f.Close()
	ch, err = cut()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []cbt.Extent{{Offset: 8 << 20, Length: 1 << 20}, {Offset: 16 << 20, Length: 2 * g}} {
		if cbt.Total(cbt.Clip(ch.Extents, want.Offset, want.End())) != want.Length {
			t.Fatalf("second cut %v misses %v", ch.Extents, want)
		}
	}
	if err := s.PutBackChanges("vol", ch); err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 30<<20, 2, true)
	handed, err := s.DetachChanges(ctx, "vol")
	if err != nil || handed == nil || !handed.Trusted {
		t.Fatalf("detach handed over %+v, %v", handed, err)
	}
	for _, want := range append(ch.Extents, cbt.Extent{Offset: 30 << 20, Length: 4 * g}) {
		if cbt.Total(cbt.Clip(handed.Extents, want.Offset, want.End())) != want.Length {
			t.Fatalf("detach handed over %v, missing %v", handed.Extents, want)
		}
	}

	// The next device carries the record on; the server restarts
	// cleanly (a hand-over), then uncleanly (none).
	if d, err = s.Attach(ctx, AttachSpec{VolumeID: "vol", File: file, Changes: handed.Extents, ChangesTrusted: true}); err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 40<<20, 3, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = newTestServer(t, state)
	ch, err = cut()
	if err != nil || !ch.Trusted || cbt.Total(cbt.Clip(ch.Extents, 40<<20, 40<<20+4*g)) != 4*g ||
		cbt.Total(cbt.Clip(ch.Extents, 30<<20, 30<<20+4*g)) != 4*g {
		t.Fatalf("re-adopted after a clean stop: %+v, %v; want the handed-over record, trusted", ch, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := readState(state, "vol"+stateSuffix)
	if err != nil || st.Handover == nil {
		t.Fatalf("no hand-over in the state after Close: %+v, %v", st, err)
	}
	st.Handover = nil // as if the process had died instead
	if err := saveState(state, st); err != nil {
		t.Fatal(err)
	}
	s = newTestServer(t, state)
	if ch, err = cut(); err != nil || ch.Trusted {
		t.Fatalf("re-adopted without a hand-over: %+v, %v; want untrusted", ch, err)
	}
	if err := s.Detach(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
}
