package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// device stands in for a tracking backend's device of a volume (the ublk
// server's, whose data path marks the tracker exactly as here): each
// write, discard or write-zeroes marks its range, then changes the file.
type device struct {
	t   *testing.T
	s   *Store
	vol string
	tr  *cbt.Tracker
}

func attachTracked(t *testing.T, s *Store, vol string) *device {
	t.Helper()
	exts, trusted, err := s.BeginTracking(context.Background(), vol)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := s.Volume(vol)
	tr, err := cbt.NewTracker(v.SizeBytes, 2, exts, trusted)
	if err != nil {
		t.Fatal(err)
	}
	return &device{t: t, s: s, vol: vol, tr: tr}
}

// readopted is the device of vol as a restarted plugin re-adopts it: its
// record died with the old process.
func readopted(t *testing.T, s *Store, vol string) *device {
	v, _ := s.Volume(vol)
	tr, _ := cbt.NewTracker(v.SizeBytes, 2, nil, false)
	return &device{t: t, s: s, vol: vol, tr: tr}
}

func (d *device) file() string { return d.s.VolumeFile(d.vol) }

func (d *device) write(off int64, n int, seed byte) {
	d.tr.Queue(int(off/cbt.Granularity)%2).Mark(off, int64(n))
	writeFileAt(d.t, d.file(), off, bytes.Repeat([]byte{seed}, n))
}

func (d *device) punch(off, n int64, mode uint32) {
	d.tr.Queue(0).Mark(off, n)
	f, err := os.OpenFile(d.file(), os.O_RDWR, 0)
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), mode|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		d.t.Fatal(err)
	}
}

func (d *device) snapshot(name string) blockdev.Snapshot {
	d.t.Helper()
	hold := func(context.Context) (func() error, error) { return func() error { return nil }, nil }
	cut := &ChangeCut{
		Cut:     func() ([]cbt.Extent, bool, error) { e, ok := d.tr.Cut(); return e, ok, nil },
		PutBack: d.putBack,
	}
	snap, err := d.s.CreateSnapshotTracked(context.Background(), name, d.vol, hold, cut)
	if err != nil {
		d.t.Fatalf("snapshot %s: %v", name, err)
	}
	return snap
}

// putBack is ChangeCut.PutBack of the device: the cut goes back into its
// tracker.
func (d *device) putBack(exts []cbt.Extent, trusted bool) error {
	d.tr.PutBack(exts, trusted)
	return nil
}

func (d *device) detach() {
	d.t.Helper()
	exts, trusted := d.tr.Cut()
	if err := d.s.EndTracking(context.Background(), d.vol, exts, trusted); err != nil {
		d.t.Fatal(err)
	}
}

func writeFileAt(t *testing.T, file string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

// checkDelta asks for the delta and checks it: found as want says, and
// covering every block in which the two snapshot files differ.
func checkDelta(t *testing.T, s *Store, base, target blockdev.Snapshot, want DeltaMethod) []cbt.Extent {
	t.Helper()
	exts, size, how, err := s.Delta(context.Background(), base.ID, target.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if how != want {
		t.Fatalf("delta %s..%s found by %s, want %s", base.Name, target.Name, how, want)
	}
	if size != target.SizeBytes {
		t.Fatalf("delta size %d, want %d", size, target.SizeBytes)
	}
	if !slices.Equal(exts, cbt.Normalize(slices.Clone(exts))) || len(cbt.Clip(exts, size, 1<<62)) > 0 {
		t.Fatalf("delta not normalized or past the end: %v", exts)
	}
	diff, err := cbt.Compare(context.Background(), s.dataFile(base.ID), s.dataFile(target.ID), size)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range diff {
		if cbt.Total(cbt.Clip(exts, e.Offset, e.End())) != e.Length {
			t.Fatalf("delta %s..%s = %v misses changed range %v", base.Name, target.Name, exts, e)
		}
	}
	return exts
}

const mib = 1 << 20

func TestTrackedDeltaCoversWritesDiscardsAndZeroes(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 64 * mib})
	d := attachTracked(t, s, v.ID)
	d.write(0, 8*mib, 1)
	s1 := d.snapshot("s1")
	d.write(mib, 4096, 2)                          // overlapping earlier data
	d.write(mib+2048, 4096, 3)                     // overlapping the write before
	d.write(40*mib, 128<<10, 4)                    // fresh data
	d.punch(4*mib, mib, unix.FALLOC_FL_PUNCH_HOLE) // a discard
	d.punch(6*mib, 64<<10, unix.FALLOC_FL_ZERO_RANGE)
	s2 := d.snapshot("s2")
	got := checkDelta(t, s, s1, s2, DeltaTracked)
	want := []cbt.Extent{{Offset: mib, Length: 64 << 10}, {Offset: 4 * mib, Length: mib}, {Offset: 6 * mib, Length: 64 << 10}, {Offset: 40 * mib, Length: 128 << 10}}
	if !slices.Equal(got, want) {
		t.Fatalf("delta = %v, want %v", got, want)
	}
	// A backend that does not track gets the comparison, and the same
	// changes at block granularity.
	exts, _, how, err := s.Delta(context.Background(), s1.ID, s2.ID, false)
	if err != nil || how != DeltaCompared || len(exts) == 0 {
		t.Fatalf("untracked delta = %v %s %v", exts, how, err)
	}
	for _, e := range exts {
		if cbt.Total(cbt.Clip(want, e.Offset, e.End())) != e.Length {
			t.Fatalf("compared delta %v reaches outside the tracked %v", exts, want)
		}
	}
	// Nothing written since: an empty delta, from the record.
	s3 := d.snapshot("s3")
	if got := checkDelta(t, s, s2, s3, DeltaTracked); len(got) != 0 {
		t.Fatalf("delta of an idle volume = %v", got)
	}
	// Across several snapshots: the union.
	if got := checkDelta(t, s, s1, s3, DeltaTracked); !slices.Equal(got, want) {
		t.Fatalf("delta s1..s3 = %v, want %v", got, want)
	}
}

// TestCrashBetweenWriteAndSnapshot: the plugin dies after a write (its
// record gone with it) and re-adopts the device; the next delta must
// still hold the write, found by comparing the files.
func TestCrashBetweenWriteAndSnapshot(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 16 * mib})
	d := attachTracked(t, s, v.ID)
	s1 := d.snapshot("s1")
	d.write(3*mib, 4096, 7)
	s.Close() // the crash: the tracker is lost, nothing was handed over
	s = openStore(t, dir)
	d = readopted(t, s, v.ID)
	s2 := d.snapshot("s2")
	got := checkDelta(t, s, s1, s2, DeltaCompared)
	if len(cbt.Clip(got, 3*mib, 3*mib+4096)) == 0 {
		t.Fatalf("delta %v misses the write before the crash", got)
	}
	// From the first snapshot after the re-adoption on, the device's
	// record is trusted again.
	d.write(5*mib, 4096, 8)
	s3 := d.snapshot("s3")
	if got := checkDelta(t, s, s2, s3, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: 5 * mib, Length: 64 << 10}}) {
		t.Fatalf("delta after re-adoption = %v", got)
	}
}

// TestCleanDetachHandsOverTheRecord: a device's record, handed over when
// it detaches, answers for snapshots taken while the volume is not
// staged, and carries into the next device.
func TestCleanDetachHandsOverTheRecord(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 16 * mib})
	d := attachTracked(t, s, v.ID)
	s1 := d.snapshot("s1")
	d.write(0, 4096, 1)
	d.detach()
	s2 := mustSnapshot(t, s, "s2", v.ID) // not in use: no hold
	if got := checkDelta(t, s, s1, s2, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: 0, Length: 64 << 10}}) {
		t.Fatalf("delta = %v", got)
	}
	d = attachTracked(t, s, v.ID)
	d.write(mib, 4096, 2)
	d.detach()
	d = attachTracked(t, s, v.ID)
	d.write(2*mib, 4096, 3)
	s3 := d.snapshot("s3")
	if got := checkDelta(t, s, s2, s3, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: mib, Length: 64 << 10}, {Offset: 2 * mib, Length: 64 << 10}}) {
		t.Fatalf("delta across two devices = %v", got)
	}
}

// TestUntrackedDeviceFallsBackToComparison: a device that does not track
// (the loop backend) leaves the record untrusted while it serves.
func TestUntrackedDeviceFallsBackToComparison(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 16 * mib})
	s1 := mustSnapshot(t, s, "s1", v.ID)
	if _, _, err := s.BeginTracking(context.Background(), v.ID); err != nil {
		t.Fatal(err)
	}
	writeFileAt(t, s.VolumeFile(v.ID), 5*mib, []byte("loop"))
	hold := func(context.Context) (func() error, error) { return func() error { return nil }, nil }
	s2, err := s.CreateSnapshot(context.Background(), "s2", v.ID, hold)
	if err != nil {
		t.Fatal(err)
	}
	if got := checkDelta(t, s, s1, s2, DeltaCompared); !slices.Equal(got, []cbt.Extent{{Offset: 5 * mib, Length: 4096}}) {
		t.Fatalf("delta = %v", got)
	}
	// Still served, still untracked.
	s3, err := s.CreateSnapshot(context.Background(), "s3", v.ID, hold)
	if err != nil {
		t.Fatal(err)
	}
	checkDelta(t, s, s2, s3, DeltaCompared)
}

func TestExpansionBetweenSnapshots(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	d := attachTracked(t, s, v.ID)
	d.write(0, 4096, 1)
	s1 := d.snapshot("s1")
	// Grown while attached: the device's bitmap covers the old size, a
	// write past it marks everything from there on.
	if _, err := s.ExpandVolume(ctx, v.ID, 32*mib); err != nil {
		t.Fatal(err)
	}
	d.write(20*mib, 4096, 2)
	d.write(mib, 4096, 3)
	s2 := d.snapshot("s2")
	got := checkDelta(t, s, s1, s2, DeltaTracked)
	if s2.SizeBytes != 32*mib || cbt.Total(cbt.Clip(got, 8*mib, 32*mib)) != 24*mib {
		t.Fatalf("delta over the grown range = %v", got)
	}
	d.detach()
	// Grown while detached: the next device covers the new size.
	if _, err := s.ExpandVolume(ctx, v.ID, 64*mib); err != nil {
		t.Fatal(err)
	}
	d = attachTracked(t, s, v.ID)
	d.write(40*mib, 4096, 4)
	s3 := d.snapshot("s3")
	if got := checkDelta(t, s, s2, s3, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: 40 * mib, Length: 64 << 10}}) {
		t.Fatalf("delta after a detached expansion = %v", got)
	}
}

func TestDeltaChainRules(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	w := mustCreate(t, s, VolumeSpec{Name: "w", SizeBytes: 8 * mib})
	d := attachTracked(t, s, v.ID)
	s1 := d.snapshot("s1")
	d.write(0, 4096, 1)
	s2 := d.snapshot("s2")
	d.write(mib, 4096, 2)
	s3 := d.snapshot("s3")
	t.Run("the same snapshot twice is empty", func(t *testing.T) {
		if got := checkDelta(t, s, s2, s2, DeltaTracked); len(got) != 0 {
			t.Fatalf("delta = %v", got)
		}
	})
	t.Run("a base after the target is compared", func(t *testing.T) {
		checkDelta(t, s, s3, s1, DeltaCompared)
	})
	t.Run("snapshots of different volumes are invalid", func(t *testing.T) {
		other := mustSnapshot(t, s, "other", w.ID)
		if _, _, _, err := s.Delta(ctx, s1.ID, other.ID, true); !errors.Is(err, blockdev.ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("missing snapshots are not found", func(t *testing.T) {
		for _, pair := range [][2]string{{s1.ID, blockdev.SnapshotID("none")}, {blockdev.SnapshotID("none"), s1.ID}, {"bad", s1.ID}} {
			if _, _, _, err := s.Delta(ctx, pair[0], pair[1], true); !errors.Is(err, blockdev.ErrNotFound) {
				t.Fatalf("Delta(%s, %s) err = %v, want ErrNotFound", pair[0], pair[1], err)
			}
		}
	})
	t.Run("a snapshot deleted in between is folded into the next", func(t *testing.T) {
		if err := s.DeleteSnapshot(ctx, s2.ID); err != nil {
			t.Fatal(err)
		}
		got := checkDelta(t, s, s1, s3, DeltaTracked)
		if want := []cbt.Extent{{Offset: 0, Length: 64 << 10}, {Offset: mib, Length: 64 << 10}}; !slices.Equal(got, want) {
			t.Fatalf("delta across the deleted snapshot = %v, want %v", got, want)
		}
	})
	t.Run("a base deleted and taken again is not the old one", func(t *testing.T) {
		if err := s.DeleteSnapshot(ctx, s1.ID); err != nil {
			t.Fatal(err)
		}
		d.write(2*mib, 4096, 3)
		s1again := d.snapshot("s1") // after s3 now
		d.write(3*mib, 4096, 4)
		s4 := d.snapshot("s4")
		checkDelta(t, s, s1again, s4, DeltaTracked)
		checkDelta(t, s, s1again, s3, DeltaCompared)
	})
	t.Run("records survive a restart and strays are removed", func(t *testing.T) {
		stray := filepath.Join(s.Dir(), changesDir, blockdev.SnapshotID("gone")+".json")
		if err := os.WriteFile(stray, []byte(`{"version":1}`), 0o600); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s2 := openStore(t, s.Dir())
		if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stray change record kept: %v", err)
		}
		snap4, _ := s2.Snapshot(blockdev.SnapshotID("s4"))
		snap1, _ := s2.Snapshot(blockdev.SnapshotID("s1"))
		checkDelta(t, s2, snap1, snap4, DeltaTracked)
	})
}

// TestFailedSnapshotPutsTheCutBack: a snapshot that fails after the cut
// must not lose the writes the cut took.
func TestFailedSnapshotPutsTheCutBack(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	d := attachTracked(t, s, v.ID)
	s1 := d.snapshot("s1")
	d.write(mib, 4096, 1)
	d.snapshotFailingAfterCut(d.putBack)
	s2 := d.snapshot("s2")
	if got := checkDelta(t, s, s1, s2, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: mib, Length: 64 << 10}}) {
		t.Fatalf("delta = %v, want the write before the failed snapshot", got)
	}
}

// snapshotFailingAfterCut takes a snapshot of the device's volume that
// fails after its cut (the hold's release fails), the cut handed to
// putBack.
func (d *device) snapshotFailingAfterCut(putBack func([]cbt.Extent, bool) error) {
	d.t.Helper()
	boom := errors.New("release failed")
	hold := func(context.Context) (func() error, error) { return func() error { return boom }, nil }
	cut := &ChangeCut{
		Cut:     func() ([]cbt.Extent, bool, error) { e, ok := d.tr.Cut(); return e, ok, nil },
		PutBack: putBack,
	}
	if _, err := d.s.CreateSnapshotTracked(context.Background(), "failed", d.vol, hold, cut); !errors.Is(err, boom) {
		d.t.Fatalf("err = %v, want the release's", err)
	}
}

// TestDeltaDifferential writes random data, discards and zeroes into a
// tracked volume between snapshots, with detaches and re-adoptions in
// between, and checks every delta between any two snapshots against a
// brute-force comparison of their bytes.
func TestDeltaDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	s := openStore(t, t.TempDir())
	const size = 8 * mib
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: size})
	d := attachTracked(t, s, v.ID)
	var snaps []blockdev.Snapshot
	rounds := 12
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		for range rng.IntN(20) {
			off := rng.Int64N(size-(256<<10)) / 512 * 512
			switch rng.IntN(5) {
			case 0:
				d.punch(off/4096*4096, 64<<10, unix.FALLOC_FL_PUNCH_HOLE)
			case 1:
				d.punch(off/4096*4096, 64<<10, unix.FALLOC_FL_ZERO_RANGE)
			default:
				d.write(off, 512*(1+rng.IntN(256)), byte(rng.IntN(4)))
			}
		}
		switch rng.IntN(6) {
		case 0:
			d.detach()
			d = attachTracked(t, s, v.ID)
		case 1:
			d = readopted(t, s, v.ID)
		}
		snaps = append(snaps, d.snapshot("s"+string(rune('a'+round))))
	}
	checkAllDeltas(t, s, snaps)
	// Delete some, the latest among them at times: deltas between the
	// rest still cover every change.
	for range len(snaps) / 2 {
		k := rng.IntN(len(snaps))
		if err := s.DeleteSnapshot(context.Background(), snaps[k].ID); err != nil {
			t.Fatal(err)
		}
		snaps = slices.Delete(snaps, k, k+1)
		d.write(rng.Int64N(size-(256<<10)), 4096, byte(rng.IntN(4)))
		snaps = append(snaps, d.snapshot(fmt.Sprintf("after-delete-%d", len(snaps))))
	}
	checkAllDeltas(t, s, snaps)
}

// checkAllDeltas checks the delta between every two snapshots, in order,
// against a byte comparison of their files: never a change missed, and
// exactly the changed blocks when compared.
func checkAllDeltas(t *testing.T, s *Store, snaps []blockdev.Snapshot) {
	t.Helper()
	methods := map[DeltaMethod]int{}
	defer func() { t.Logf("%d snapshots: deltas %v", len(snaps), methods) }()
	for i := range snaps {
		for j := i; j < len(snaps); j++ {
			exts, _, how, err := s.Delta(context.Background(), snaps[i].ID, snaps[j].ID, true)
			if err != nil {
				t.Fatal(err)
			}
			methods[how]++
			want := bruteDelta(t, s.dataFile(snaps[i].ID), s.dataFile(snaps[j].ID))
			for _, e := range want {
				if cbt.Total(cbt.Clip(exts, e.Offset, e.End())) != e.Length {
					t.Fatalf("delta %d..%d (%s) = %v misses %v", i, j, how, exts, e)
				}
			}
			if how == DeltaCompared && !slices.Equal(exts, want) {
				t.Fatalf("compared delta %d..%d = %v, want %v", i, j, exts, want)
			}
		}
	}
}

func bruteDelta(t *testing.T, a, b string) []cbt.Extent {
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []cbt.Extent
	for off := 0; off < len(db); off += 4096 {
		if !bytes.Equal(da[off:off+4096], db[off:off+4096]) {
			out = append(out, cbt.Extent{Offset: int64(off), Length: 4096})
		}
	}
	return cbt.Normalize(out)
}

// TestDeletedVolumesRecordNeverOutlivesIt: a volume whose change record
// cannot be removed is not deleted (the deletion fails, and so does its
// retry, the volume intact); once it can be, the deletion goes through,
// and a new volume created under the same ID starts untrusted instead of
// inheriting the old one's trusted record.
func TestDeletedVolumesRecordNeverOutlivesIt(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	d := attachTracked(t, s, v.ID)
	d.snapshot("s1")
	d.write(mib, 4096, 1)
	d.detach() // a clean hand-over: the record on disk is trusted
	rec := s.changesPath(v.ID)
	setImmutable(t, rec, true)
	for try := range 2 { // the provisioner retries a failed deletion
		err := s.DeleteVolume(ctx, v.ID, nil)
		if _, gone := s.Volume(v.ID); err == nil || gone != nil {
			setImmutable(t, rec, false)
			t.Fatalf("deletion %d while the change record cannot be removed: %v, volume lookup %v; want an error and the volume kept",
				try, err, gone)
		}
	}
	setImmutable(t, rec, false)
	if err := s.DeleteVolume(ctx, v.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("change record of the deleted volume: %v", err)
	}
	again := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	if exts, trusted, err := s.BeginTracking(ctx, again.ID); err != nil || trusted {
		t.Fatalf("new volume under the deleted one's ID starts from %v trusted %t (%v); want untrusted", exts, trusted, err)
	}
}

// fsImmutable is FS_IMMUTABLE_FL (include/uapi/linux/fs.h); x/sys/unix
// does not name it.
const fsImmutable = 0x10

// setImmutable sets or clears FS_IMMUTABLE_FL (chattr +i) on path: root
// can neither remove nor replace the file while it is set.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	f, err := os.Open(path)
	if !on && errors.Is(err, os.ErrNotExist) {
		return // removed once it could be
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatalf("get flags of %s: %v", path, err)
	}
	if on {
		flags |= fsImmutable
	} else {
		flags &^= fsImmutable
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatalf("set flags of %s: %v", path, err)
	}
	if on {
		t.Cleanup(func() { setImmutable(t, path, false) })
	}
}

// TestCutNoDeviceTakesBackIsKept: a snapshot fails after its cut while the
// device no longer takes the cut back (the plugin stopped meanwhile and
// the device handed its record, without the cut, over to the next
// process; or the device is gone): the cut's writes must reach the next
// snapshot's record all the same.
func TestCutNoDeviceTakesBackIsKept(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "v", SizeBytes: 8 * mib})
	d := attachTracked(t, s, v.ID)
	s1 := d.snapshot("s1")
	d.write(mib, 4096, 1)
	d.snapshotFailingAfterCut(func([]cbt.Extent, bool) error { return fmt.Errorf("put back: %w", os.ErrNotExist) })
	// The next process's device carries on what it was handed over:
	// everything since the cut (nothing), trusted.
	exts, trusted := d.tr.Cut()
	tr, err := cbt.NewTracker(v.SizeBytes, 2, exts, trusted)
	if err != nil {
		t.Fatal(err)
	}
	next := &device{t: t, s: s, vol: v.ID, tr: tr}
	next.write(2*mib, 4096, 2)
	s2 := next.snapshot("s2")
	got := checkDelta(t, s, s1, s2, DeltaTracked)
	if cbt.Total(cbt.Clip(got, mib, mib+4096)) != 4096 {
		t.Fatalf("delta = %v, want the write before the failed snapshot in it", got)
	}
}
