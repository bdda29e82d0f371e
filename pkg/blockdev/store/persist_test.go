package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
)

// TestReopen checks that a reopened store sees every acknowledged change.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	a := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 4 << 20, Params: map[string]string{"fsType": "xfs"}})
	testfs.WriteAt(t, s.VolumeFile(a.ID), 0, 4096, 1)
	snap := mustSnapshot(t, s, "snap-a", a.ID)
	mustCreate(t, s, VolumeSpec{Name: "from-snap", SizeBytes: 8 << 20, SourceSnapshotID: snap.ID})
	mustCreate(t, s, VolumeSpec{Name: "clone", SourceVolumeID: a.ID})
	gone := mustCreate(t, s, VolumeSpec{Name: "gone", SizeBytes: 1 << 20})
	if _, err := s.ExpandVolume(ctx, a.ID, 6<<20); err != nil {
		t.Fatal(err)
	}
	ns := blockdev.NodeState{StagingPath: "/st", FsType: "xfs", Device: "/dev/fastblk/" + a.ID, Backend: "loop",
		Targets: map[string]blockdev.Publish{"/t1": {ReadOnly: true}, "/t2": {SingleWriter: true}}}
	if _, err := s.UpdateNode(ctx, a.ID, ns); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, gone.ID, nil); err != nil {
		t.Fatal(err)
	}

	r := openStore(t, dir)
	if !reflect.DeepEqual(r.Volumes(), s.Volumes()) {
		t.Fatalf("reopened volumes\n%+v\nwant\n%+v", r.Volumes(), s.Volumes())
	}
	if !reflect.DeepEqual(r.Snapshots(), s.Snapshots()) {
		t.Fatalf("reopened snapshots\n%+v\nwant\n%+v", r.Snapshots(), s.Snapshots())
	}
	if v, _ := r.Volume(a.ID); v.SizeBytes != 6<<20 || !reflect.DeepEqual(v.Node, ns) {
		t.Fatalf("reopened %+v lost the expansion or node state", v)
	}
}

// TestCrashLeftovers simulates crashes at every step of the write protocol
// and checks that Open keeps what was acknowledged and removes the rest.
func TestCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	a := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	snap := mustSnapshot(t, s, "snap", a.ID)
	acked, ackedSnaps := s.Volumes(), s.Snapshots()

	// 1. Crash between temp write and rename of an update to a: the temp
	//    file holds a record that was never acknowledged.
	newer := acked[0]
	newer.SizeBytes = 99 << 20
	leave(t, filepath.Join(dir, "meta", tempPrefix+a.ID+".json-123"), recordJSON(t, record{State: stateReady, Volume: &newer}))
	// 2. Crash after making b's data file, before its record.
	b := blockdev.VolumeID("b")
	leave(t, filepath.Join(dir, "volumes", b+imgSuffix), []byte("half-made"))
	// 3. A record that is not ready (a half-made volume) with its file.
	c := blockdev.VolumeID("c")
	half := blockdev.Volume{ID: c, Name: "c", SizeBytes: 1 << 20}
	leave(t, filepath.Join(dir, "meta", c+metaSuffix), recordJSON(t, record{State: "creating", Volume: &half}))
	leave(t, filepath.Join(dir, "volumes", c+imgSuffix), nil)
	// 4. A snapshot file without a record, and temp files in data dirs.
	leave(t, filepath.Join(dir, "snapshots", blockdev.SnapshotID("x")+imgSuffix), nil)
	leave(t, filepath.Join(dir, "volumes", tempPrefix+"junk"), nil)
	// 5. Files the store does not own are left alone.
	foreign := filepath.Join(dir, "volumes", "README")
	leave(t, foreign, nil)
	// 6. Temp files are removed once stale; a fresh one may be another
	//    writer's, in flight.
	old := time.Now().Add(-2 * atomicfile.StaleAge)
	for _, p := range []string{filepath.Join(dir, "meta", tempPrefix+a.ID+".json-123"), filepath.Join(dir, "volumes", tempPrefix+"junk")} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	fresh := filepath.Join(dir, "meta", tempPrefix+b+".json-456")
	leave(t, fresh, []byte("{"))

	r := openStore(t, dir)
	if !reflect.DeepEqual(r.Volumes(), acked) || !reflect.DeepEqual(r.Snapshots(), ackedSnaps) {
		t.Fatalf("after crash: %+v %+v\nwant %+v %+v", r.Volumes(), r.Snapshots(), acked, ackedSnaps)
	}
	for _, p := range []string{
		filepath.Join(dir, "meta", tempPrefix+a.ID+".json-123"),
		filepath.Join(dir, "volumes", b+imgSuffix),
		filepath.Join(dir, "meta", c+metaSuffix),
		filepath.Join(dir, "volumes", c+imgSuffix),
		filepath.Join(dir, "snapshots", blockdev.SnapshotID("x")+imgSuffix),
		filepath.Join(dir, "volumes", tempPrefix+"junk"),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s not removed (%v)", p, err)
		}
	}
	for _, p := range []string{foreign, fresh, r.VolumeFile(a.ID), r.dataFile(snap.ID)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// The half-made names can be created for real now.
	mustCreate(t, r, VolumeSpec{Name: "b", SizeBytes: 1 << 20})
	mustCreate(t, r, VolumeSpec{Name: "c", SizeBytes: 1 << 20})
}

func TestOpenRejects(t *testing.T) {
	for label, cfg := range map[string]Config{
		"no-dir":      {},
		"ratio-below": {Dir: t.TempDir(), OverProvisionRatio: 0.5},
		"ratio-nan":   {Dir: t.TempDir(), OverProvisionRatio: -1},
	} {
		t.Run(label, func(t *testing.T) {
			if _, err := Open(cfg); !errors.Is(err, blockdev.ErrInvalid) {
				t.Fatalf("Open(%+v) = %v, want ErrInvalid", cfg, err)
			}
		})
	}
}

// TestOpenQuarantinesCorruptRecord proves that a record that does not
// decode does not stop the store: it is set aside (renamed, never deleted)
// and listed by Quarantined, every other object is served, the volume's
// file is kept across restarts, and its ID is neither reused nor deleted.
func TestOpenQuarantinesCorruptRecord(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	a := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	b := mustCreate(t, s, VolumeSpec{Name: "b", SizeBytes: 1 << 20})
	testfs.WriteAt(t, s.VolumeFile(b.ID), 0, 4096, 7)
	s.Close()
	leave(t, filepath.Join(dir, "meta", b.ID+metaSuffix), []byte("{not json"))

	for range 2 { // the second open finds it set aside already
		r, err := Open(Config{Dir: dir})
		if err != nil {
			t.Fatalf("Open with one corrupt record: %v", err)
		}
		if vols := r.Volumes(); len(vols) != 1 || vols[0].ID != a.ID {
			t.Fatalf("volumes %+v, want only %s", vols, a.ID)
		}
		q := r.Quarantined()
		if len(q) != 1 || !strings.HasPrefix(filepath.Base(q[0]), b.ID+metaSuffix+".corrupt-") {
			t.Fatalf("Quarantined = %q, want %s's record", q, b.ID)
		}
		if data, err := os.ReadFile(q[0]); err != nil || string(data) != "{not json" {
			t.Fatalf("set-aside record holds %q, %v; want the original bytes", data, err)
		}
		if _, err := r.CreateVolume(ctx, VolumeSpec{Name: "b", SizeBytes: 1 << 20}); !errors.Is(err, blockdev.ErrConflict) {
			t.Errorf("CreateVolume over the quarantined ID = %v, want ErrConflict", err)
		}
		if err := r.DeleteVolume(ctx, b.ID, nil); err != nil {
			t.Errorf("DeleteVolume of the quarantined ID = %v, want nil (unknown)", err)
		}
		if fi, err := os.Stat(r.VolumeFile(b.ID)); err != nil || fi.Size() != 1<<20 {
			t.Fatalf("volume file of the quarantined record: %v, %v; want it kept", fi, err)
		}
		r.Close()
	}
}

func leave(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOpenQuarantinesInvalidRecord proves that a record that decodes
// but is not a complete object is treated as one that does not decode: set
// aside (renamed, its bytes kept) and listed by Quarantined, its data file
// kept and its ID held, while every valid object is still served. (Every
// kind of record the store writes loads back unchanged: TestReopen; a
// complete half-made one is removed: TestCrashLeftovers.)
func TestOpenQuarantinesInvalidRecord(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	a := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	snap := mustSnapshot(t, s, "snap-a", a.ID)
	s.Close()

	vol := func(edit func(*blockdev.Volume)) func(string) record {
		return func(name string) record {
			v := blockdev.Volume{ID: blockdev.VolumeID(name), Name: name, SizeBytes: 1 << 20, CreatedAt: time.Now().UTC()}
			edit(&v)
			return record{State: stateReady, Volume: &v}
		}
	}
	sn := func(edit func(*blockdev.Snapshot)) func(string) record {
		return func(name string) record {
			v := blockdev.Snapshot{ID: blockdev.SnapshotID(name), Name: name, SourceVolumeID: a.ID, SizeBytes: 1 << 20, CreatedAt: time.Now().UTC()}
			edit(&v)
			return record{State: stateReady, Snapshot: &v}
		}
	}
	// Each record sits at the ID its case's name derives.
	cases := []struct {
		name     string
		snapshot bool
		rec      func(name string) record
		raw      string // instead of rec
	}{
		{name: "negative-size", rec: vol(func(v *blockdev.Volume) { v.SizeBytes = -1 })},
		{name: "zero-size", rec: vol(func(v *blockdev.Volume) { v.SizeBytes = 0 })},
		{name: "unaligned-size", rec: vol(func(v *blockdev.Volume) { v.SizeBytes = 1<<20 + 1 })},
		{name: "name-deriving-another-id", rec: vol(func(v *blockdev.Volume) { v.Name = "../../x" })},
		{name: "no-name", rec: vol(func(v *blockdev.Volume) { v.Name = "" })},
		{name: "id-only", raw: `{"state":"ready","volume":{"id":"` + blockdev.VolumeID("id-only") + `"}}`},
		{name: "unknown-state", rec: func(name string) record {
			r := vol(func(*blockdev.Volume) {})(name)
			r.State = "readx"
			return r
		}},
		{name: "no-state", raw: `{"volume":{"id":"` + blockdev.VolumeID("no-state") + `","name":"no-state","sizeBytes":4096}}`},
		{name: "two-sources", rec: vol(func(v *blockdev.Volume) { v.SourceSnapshotID, v.SourceVolumeID = snap.ID, a.ID })},
		{name: "source-not-an-id", rec: vol(func(v *blockdev.Volume) { v.SourceVolumeID = "../volumes/x" })},
		{name: "relative-staging-path", rec: vol(func(v *blockdev.Volume) { v.Node.StagingPath = "staging" })},
		{name: "negative-tuning", rec: vol(func(v *blockdev.Volume) { v.Node.Tuning.Queues = -1 })},
		{name: "snap-unaligned-size", snapshot: true, rec: sn(func(v *blockdev.Snapshot) { v.SizeBytes = 4095 })},
		{name: "snap-name-deriving-another-id", snapshot: true, rec: sn(func(v *blockdev.Snapshot) { v.Name = "snap-a" })},
		{name: "snap-no-source", snapshot: true, rec: sn(func(v *blockdev.Snapshot) { v.SourceVolumeID = "" })},
	}
	ids := make([]string, len(cases))
	files := make([][]byte, len(cases))
	for i, c := range cases {
		ids[i], files[i] = blockdev.VolumeID(c.name), []byte(c.raw)
		if c.snapshot {
			ids[i] = blockdev.SnapshotID(c.name)
		}
		if c.rec != nil {
			files[i] = recordJSON(t, c.rec(c.name))
		}
		leave(t, filepath.Join(dir, "meta", ids[i]+metaSuffix), files[i])
		sub := "volumes"
		if c.snapshot {
			sub = "snapshots"
		}
		leave(t, filepath.Join(dir, sub, ids[i]+imgSuffix), []byte("data of "+c.name))
	}

	for range 2 { // the second open finds them set aside already
		r := openStore(t, dir)
		if vols, snaps := r.Volumes(), r.Snapshots(); len(vols) != 1 || vols[0].ID != a.ID || len(snaps) != 1 || snaps[0].ID != snap.ID {
			t.Fatalf("served %+v and %+v, want only %s and %s", vols, snaps, a.ID, snap.ID)
		}
		q := r.Quarantined()
		if len(q) != len(cases) {
			t.Fatalf("Quarantined = %q, want the %d invalid records", q, len(cases))
		}
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				set, ok := r.quarantined[ids[i]]
				if !ok || !strings.HasPrefix(filepath.Base(set), ids[i]+metaSuffix+corruptMark) {
					t.Fatalf("record of %s set aside as %q, want %s%s<time>", ids[i], set, ids[i]+metaSuffix, corruptMark)
				}
				if data, err := os.ReadFile(set); err != nil || string(data) != string(files[i]) {
					t.Fatalf("set-aside record holds %q, %v; want the original %q", data, err, files[i])
				}
				if data, err := os.ReadFile(r.dataFile(ids[i])); err != nil || string(data) != "data of "+c.name {
					t.Fatalf("data file holds %q, %v; want it kept", data, err)
				}
				var err error
				if c.snapshot {
					_, err = r.CreateSnapshot(ctx, c.name, a.ID, nil)
				} else {
					_, err = r.CreateVolume(ctx, VolumeSpec{Name: c.name, SizeBytes: 1 << 20})
				}
				if !errors.Is(err, blockdev.ErrConflict) {
					t.Errorf("create %q over the set-aside record = %v, want ErrConflict", c.name, err)
				}
			})
		}
		r.Close()
	}
}

// TestHandoffPeerPersists: the peer a handoff made a volume for is kept
// across a restart, is no part of the volume's identity (a repeated
// create without it finds the volume), and AdoptHandoff clears it
// durably.
func TestHandoffPeerPersists(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	mustCreate(t, s, VolumeSpec{Name: "pvc-h", SizeBytes: 1 << 20, HandoffPeer: "n2"})
	if v := mustCreate(t, s, VolumeSpec{Name: "pvc-h", SizeBytes: 1 << 20}); v.HandoffPeer != "n2" {
		t.Fatalf("repeated create: %+v, want the volume made for n2", v)
	}
	s.Close()
	s = openStore(t, dir)
	id := blockdev.VolumeID("pvc-h")
	if v, err := s.Volume(id); err != nil || v.HandoffPeer != "n2" {
		t.Fatalf("after a restart: %+v, %v; want HandoffPeer n2", v, err)
	}
	if _, err := s.AdoptHandoff(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir)
	if v, err := s.Volume(id); err != nil || v.HandoffPeer != "" {
		t.Fatalf("adopted, after a restart: %+v, %v; want no HandoffPeer", v, err)
	}
}
