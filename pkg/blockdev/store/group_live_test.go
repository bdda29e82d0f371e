package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/quiesce"
)

// frozenHold holds lv as the driver holds a mounted volume: its
// filesystem frozen, the freeze recorded first.
func frozenHold(lv liveVolume) Hold {
	return func(ctx context.Context) (func() error, error) {
		return quiesce.FreezeVolume(ctx, lv.s.Dir(), lv.v.ID, lv.mnt, lv.dev)
	}
}

// sequenceWriter writes 1, 2, 3, ... to two files on two volumes, each
// number first to the log and then to the data, syncing each write
// before the next: the data never holds a number the log lacks, as a
// database's write-ahead log is always ahead of its data.
type sequenceWriter struct {
	log, data string
	stop      chan struct{}
	done      sync.WaitGroup
	err       error
	n         int
}

func startSequence(t testing.TB, logDir, dataDir string) *sequenceWriter {
	t.Helper()
	w := &sequenceWriter{log: filepath.Join(logDir, "log"), data: filepath.Join(dataDir, "data"), stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		w.err = w.run()
	}()
	t.Cleanup(w.finish)
	return w
}

func (w *sequenceWriter) run() error {
	log, err := os.OpenFile(w.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	data, err := os.OpenFile(w.data, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer data.Close()
	for w.n = 1; ; w.n++ {
		select {
		case <-w.stop:
			return nil
		default:
		}
		for _, f := range []*os.File{log, data} {
			if _, err := fmt.Fprintf(f, "%d\n", w.n); err != nil {
				return err
			}
			if err := f.Sync(); err != nil {
				return err
			}
		}
	}
}

// finish stops the writer (idempotent) and returns how far it got.
func (w *sequenceWriter) finish() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.done.Wait()
}

// lastNumber is the last complete number of a sequence file in a
// snapshot's filesystem (0 when it has none).
func lastNumber(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n") // the last line may be cut short
	for i := len(lines) - 2; i >= 0; i-- {
		if n, err := strconv.Atoi(lines[i]); err == nil {
			return n
		}
	}
	return 0
}

// TestGroupSnapshotKeepsLogAheadOfData takes group snapshots of a mounted
// log volume and a mounted data volume while a writer appends a sequence
// to both, log first: in every group the restored log holds every number
// the restored data holds. Two snapshots taken one after the other (log,
// then data) beside it break that; how often is logged.
func TestGroupSnapshotKeepsLogAheadOfData(t *testing.T) {
	testgate.RequireRoot(t)
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	// The log's volume ID sorts first, so a group that took its members
	// one after the other in their order would break the invariant as
	// the plain snapshots below do.
	logv, datav := mountVolume(t, s, "wal", 64<<20), mountVolume(t, s, "data", 64<<20)
	if logv.v.ID > datav.v.ID {
		t.Fatalf("the log's volume %s sorts after the data's %s: the test would not catch members taken in turn", logv.v.ID, datav.v.ID)
	}
	w := startSequence(t, logv.mnt, datav.mnt)
	const tries = 6
	broken := 0
	for i := range tries {
		name := "g" + strconv.Itoa(i)
		g, err := s.CreateGroupSnapshot(ctx, name, []GroupSource{
			{VolumeID: logv.v.ID, Hold: frozenHold(logv)}, {VolumeID: datav.v.ID, Hold: frozenHold(datav)}})
		if err != nil {
			t.Fatal(err)
		}
		l, d := restoredSequence(t, s, g.Members, logv.v.ID)
		if d > l || d == 0 {
			t.Fatalf("group %s: the restored data holds %d, the restored log %d: want data > 0 and never ahead of the log", name, d, l)
		}
		// Two plain snapshots, the log's first, as two VolumeSnapshots
		// taken one after the other are.
		ls, err := s.CreateSnapshot(ctx, name+"-log", logv.v.ID, frozenHold(logv))
		if err != nil {
			t.Fatal(err)
		}
		ds, err := s.CreateSnapshot(ctx, name+"-data", datav.v.ID, frozenHold(datav))
		if err != nil {
			t.Fatal(err)
		}
		pl, pd := lastNumber(t, filepath.Join(mountImageRO(t, s.dataFile(ls.ID)), "log")),
			lastNumber(t, filepath.Join(mountImageRO(t, s.dataFile(ds.ID)), "data"))
		if pd > pl {
			broken++
		}
		t.Logf("try %d: group log %d data %d; plain snapshots log %d data %d", i, l, d, pl, pd)
	}
	w.finish()
	if w.err != nil {
		t.Fatal(w.err)
	}
	t.Logf("%d numbers written; the plain snapshots restored data ahead of the log in %d of %d tries, the group in none", w.n, broken, tries)
}

// restoredSequence mounts a group's members read-only and returns the
// last numbers of the log (on logVol's member) and of the data.
func restoredSequence(t *testing.T, s *Store, members []blockdev.GroupMember, logVol string) (log, data int) {
	t.Helper()
	for _, m := range members {
		dir := mountImageRO(t, s.dataFile(m.SnapshotID))
		if m.VolumeID == logVol {
			log = lastNumber(t, filepath.Join(dir, "log"))
		} else {
			data = lastNumber(t, filepath.Join(dir, "data"))
		}
	}
	return log, data
}

// Environment of the child process TestCrashWhileGroupFrozen re-executes.
const groupCrashChildEnv = "FASTBLK_TEST_GROUP_FROZEN_CHILD"

// TestCrashWhileGroupFrozen kills a process in the middle of a group
// snapshot, while it holds both members' filesystems frozen, and proves
// that the next start thaws both, removes the half-made group and its
// members, and that the group can then be made.
func TestCrashWhileGroupFrozen(t *testing.T) {
	if env := os.Getenv(groupCrashChildEnv); env != "" {
		groupFrozenChild(env) // never returns
	}
	testgate.RequireRoot(t)
	data := t.TempDir()
	s := openStore(t, data)
	vols := []liveVolume{mountVolume(t, s, "log", 64<<20), mountVolume(t, s, "data", 64<<20)}
	if err := s.Close(); err != nil { // the child is the plugin now
		t.Fatal(err)
	}
	args := []string{data}
	for _, lv := range vols {
		args = append(args, lv.v.ID, lv.mnt, lv.dev)
	}
	child, out := startChild(t, "TestCrashWhileGroupFrozen", groupCrashChildEnv, args, vols[0].mnt, vols[1].mnt)
	waitLine(t, out, "all frozen")
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	for _, lv := range vols {
		if !isFrozen(t, lv.mnt) {
			t.Fatalf("%s is not frozen after the kill: the test did not reach its window", lv.mnt)
		}
	}

	s = restartStore(t, data)

	for _, lv := range vols {
		if isFrozen(t, lv.mnt) {
			t.Fatalf("%s is still frozen after the plugin restarted", lv.mnt)
		}
		if err := writeWithin(filepath.Join(lv.mnt, "after"), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	checkNoGroup(t, s, "g", 0)
	for i := range vols {
		vols[i].s = s
	}
	g, err := s.CreateGroupSnapshot(context.Background(), "g", []GroupSource{
		{VolumeID: vols[0].v.ID, Hold: frozenHold(vols[0])}, {VolumeID: vols[1].v.ID, Hold: frozenHold(vols[1])}})
	if err != nil {
		t.Fatalf("group after the restart: %v", err)
	}
	for _, m := range g.Members {
		dir := mountImageRO(t, s.dataFile(m.SnapshotID))
		if _, err := os.Stat(filepath.Join(dir, "after")); err != nil {
			t.Errorf("member %s lacks the write made before it: %v", m.SnapshotID, err)
		}
	}
}

// groupFrozenChild is the process TestCrashWhileGroupFrozen kills: it
// takes a group snapshot of the two mounted volumes and, once both are
// frozen, reports "all frozen" and waits to be killed.
func groupFrozenChild(env string) {
	args := strings.Split(env, "\n")
	s, err := Open(Config{Dir: args[0]})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var sources []GroupSource
	last := "" // the member held last: the store holds them in ID order
	for i := 1; i+2 < len(args); i += 3 {
		last = max(last, args[i])
	}
	for i := 1; i+2 < len(args); i += 3 {
		id, mnt, dev := args[i], args[i+1], args[i+2]
		sources = append(sources, GroupSource{VolumeID: id, Hold: func(ctx context.Context) (func() error, error) {
			thaw, err := quiesce.FreezeVolume(ctx, s.Dir(), id, mnt, dev)
			if err == nil && id == last {
				fmt.Println("all frozen")
				time.Sleep(time.Hour) // killed here
			}
			return thaw, err
		}})
	}
	_, err = s.CreateGroupSnapshot(context.Background(), "g", sources)
	fmt.Fprintln(os.Stderr, "group snapshot returned:", err)
	os.Exit(3)
}

// BenchmarkGroupHeldWindow measures how long a group snapshot of two
// mounted ext4 volumes holds them while a writer appends to both (each
// volume 256 MiB with 64 MiB of files, on a data directory that cannot
// reflink, so each member's copy catches up by comparing files): holding,
// from the first member's freeze to the last member frozen, and held, from
// the first freeze to the last thaw, the longest any writer of the group
// waits. Beside it, held for a snapshot of one of the volumes alone.
// Medians over the iterations, in milliseconds; docs/group-snapshots.md
// has the figures.
func BenchmarkGroupHeldWindow(b *testing.B) {
	testgate.RequireRoot(b)
	ctx := context.Background()
	s := openStore(b, b.TempDir())
	vols := []liveVolume{mountVolume(b, s, "log", 256<<20), mountVolume(b, s, "data", 256<<20)}
	for _, lv := range vols {
		file := filepath.Join(lv.mnt, "fill")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		testfs.WriteAt(b, file, 0, 64<<20, 7)
	}
	w := startSequence(b, vols[0].mnt, vols[1].mnt)
	var holding, held, single []time.Duration
	for i := 0; b.Loop(); i++ {
		var start, allHeld, released time.Time
		measure := func(hold Hold) Hold {
			return func(ctx context.Context) (func() error, error) {
				if start.IsZero() {
					start = time.Now()
				}
				release, err := hold(ctx)
				allHeld = time.Now()
				return func() error { err := release(); released = time.Now(); return err }, err
			}
		}
		g, err := s.CreateGroupSnapshot(ctx, "g"+strconv.Itoa(i), []GroupSource{
			{VolumeID: vols[0].v.ID, Hold: measure(frozenHold(vols[0]))}, {VolumeID: vols[1].v.ID, Hold: measure(frozenHold(vols[1]))}})
		if err != nil {
			b.Fatal(err)
		}
		holding, held = append(holding, allHeld.Sub(start)), append(held, released.Sub(start))
		start = time.Time{}
		snap, err := s.CreateSnapshot(ctx, "s"+strconv.Itoa(i), vols[1].v.ID, measure(frozenHold(vols[1])))
		if err != nil {
			b.Fatal(err)
		}
		single = append(single, released.Sub(start))
		if err := s.DeleteGroupSnapshot(ctx, g.ID); err != nil {
			b.Fatal(err)
		}
		if err := s.DeleteSnapshot(ctx, snap.ID); err != nil {
			b.Fatal(err)
		}
	}
	w.finish()
	if w.err != nil {
		b.Fatal(w.err)
	}
	for name, d := range map[string][]time.Duration{"group-holding-ms": holding, "group-held-ms": held, "single-held-ms": single} {
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name)
	}
}
