package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/cbt"
)

// events records, in order, what the holds and cuts of a group did.
type events []string

// source is a group source of d's volume (a tracked device) whose hold,
// release and cut append to ev; failHold and failRelease make them fail.
func (d *device) source(ev *events, failHold, failRelease error) GroupSource {
	name := d.vol[:4]
	return GroupSource{
		VolumeID: d.vol,
		Hold: func(context.Context) (func() error, error) {
			if failHold != nil {
				return nil, failHold
			}
			*ev = append(*ev, "hold "+name)
			return func() error { *ev = append(*ev, "release "+name); return failRelease }, nil
		},
		Cut: &ChangeCut{
			Cut: func() ([]cbt.Extent, bool, error) {
				*ev = append(*ev, "cut "+name)
				e, ok := d.tr.Cut()
				return e, ok, nil
			},
			PutBack: func(e []cbt.Extent, ok bool) error {
				*ev = append(*ev, "put back "+name)
				d.tr.PutBack(e, ok)
				return nil
			},
		},
	}
}

// twoTracked makes volumes a and b of 8 MiB with a tracked device each,
// in order of their IDs.
func twoTracked(t *testing.T, s *Store) (a, b *device) {
	t.Helper()
	va := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 8 * mib})
	vb := mustCreate(t, s, VolumeSpec{Name: "b", SizeBytes: 8 * mib})
	a, b = attachTracked(t, s, va.ID), attachTracked(t, s, vb.ID)
	if a.vol > b.vol {
		a, b = b, a
	}
	return a, b
}

// TestGroupSnapshotHoldsEveryMemberBeforeAnyCut: every member is held
// before any member's record is cut and copy made exact, and released
// only after all of them; the members are snapshots of their group, copies
// of their volumes, and each starts its volume's next change record, so
// that a later snapshot's delta comes from the records.
func TestGroupSnapshotHoldsEveryMemberBeforeAnyCut(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	a, b := twoTracked(t, s)
	a.write(0, 4096, 1)
	b.write(mib, 4096, 2)
	var ev events
	g, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{b.source(&ev, nil, nil), a.source(&ev, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	an, bn := a.vol[:4], b.vol[:4]
	want := events{"hold " + an, "hold " + bn, "cut " + an, "cut " + bn, "release " + bn, "release " + an}
	if !slices.Equal(ev, want) {
		t.Fatalf("the group did %q, want %q", ev, want)
	}
	if g.ID != blockdev.GroupSnapshotID("g") || len(g.Members) != 2 || g.Members[0].VolumeID != a.vol || g.Members[1].VolumeID != b.vol {
		t.Fatalf("group %+v: want ID %s and members a, b in ID order", g, blockdev.GroupSnapshotID("g"))
	}
	for _, m := range g.Members {
		snap, err := s.Snapshot(m.SnapshotID)
		if err != nil || snap.GroupID != g.ID || snap.SourceVolumeID != m.VolumeID || !snap.CreatedAt.Equal(g.CreatedAt) {
			t.Fatalf("member %+v: snapshot %+v, %v; want one of the group's volume, made with it", m, snap, err)
		}
		testfs.SamePrefix(t, s.dataFile(m.SnapshotID), s.VolumeFile(m.VolumeID))
	}
	a.write(2*mib, 4096, 3)
	later := a.snapshot("later")
	member, _ := s.Snapshot(g.Members[0].SnapshotID)
	if got := checkDelta(t, s, member, later, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: 2 * mib, Length: 64 << 10}}) {
		t.Fatalf("delta from the group's member = %v, want the write after the group", got)
	}
}

// TestGroupSnapshotIsIdempotentByName: a repeated create (volumes in any
// order) returns the group without holding anything; another set of
// volumes under the name, a missing volume, a volume named twice, no
// volume or a bad name fail with their classes and leave nothing.
func TestGroupSnapshotIsIdempotentByName(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	a, b := twoTracked(t, s)
	var ev events
	g, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{a.source(&ev, nil, nil), b.source(&ev, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ev = nil
	again, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{b.source(&ev, nil, nil), a.source(&ev, nil, nil)})
	if err != nil || again.ID != g.ID || !slices.Equal(again.Members, g.Members) || len(ev) != 0 {
		t.Fatalf("repeat = %+v, %v, holding %q; want the group as it is, nothing held", again, err, ev)
	}
	c := mustCreate(t, s, VolumeSpec{Name: "c", SizeBytes: mib})
	for label, tc := range map[string]struct {
		name string
		vols []string
		want error
	}{
		"other-volumes":  {"g", []string{a.vol, c.ID}, blockdev.ErrConflict},
		"missing-volume": {"h", []string{a.vol, blockdev.VolumeID("nope")}, blockdev.ErrNotFound},
		"not-a-volume":   {"h", []string{a.vol, "../../etc"}, blockdev.ErrNotFound},
		"twice":          {"h", []string{a.vol, c.ID, a.vol}, blockdev.ErrInvalid},
		"no-volumes":     {"h", nil, blockdev.ErrInvalid},
		"no-name":        {"", []string{a.vol}, blockdev.ErrInvalid},
		"name-too-long":  {strings.Repeat("n", blockdev.MaxNameLen+1), []string{a.vol}, blockdev.ErrInvalid},
	} {
		t.Run(label, func(t *testing.T) {
			var src []GroupSource
			for _, v := range tc.vols {
				src = append(src, GroupSource{VolumeID: v})
			}
			if _, err := s.CreateGroupSnapshot(ctx, tc.name, src); !errors.Is(err, tc.want) {
				t.Fatalf("CreateGroupSnapshot(%q, %v) = %v, want %v", tc.name, tc.vols, err, tc.want)
			}
		})
	}
	if _, err := s.GroupSnapshot(blockdev.GroupSnapshotID("h")); !errors.Is(err, blockdev.ErrNotFound) {
		t.Errorf("a failed group exists: %v", err)
	}
	if n := len(s.Snapshots()); n != 2 {
		t.Errorf("%d snapshots after the failed creates, want the group's 2", n)
	}
}

// TestFailedGroupSnapshotLeavesNothing: a member whose hold fails, or
// whose release fails, fails the group; every member held is released,
// every cut goes back to its device (the next snapshot's delta still
// covers the writes before the failure), no file or record of the group
// is left, and a retry makes it.
func TestFailedGroupSnapshotLeavesNothing(t *testing.T) {
	for label, tc := range map[string]struct {
		holdErr, releaseErr error
		want                func(an, bn string) events
	}{
		"hold": {holdErr: errors.New("freeze refused"), want: func(an, bn string) events {
			return events{"hold " + an, "release " + an}
		}},
		"release": {releaseErr: errors.New("thaw failed"), want: func(an, bn string) events {
			return events{"hold " + an, "hold " + bn, "cut " + an, "cut " + bn, "release " + bn, "release " + an, "put back " + an, "put back " + bn}
		}},
	} {
		t.Run(label, func(t *testing.T) {
			ctx := context.Background()
			s := openStore(t, t.TempDir())
			a, b := twoTracked(t, s)
			before := a.snapshot("before")
			a.write(mib, 4096, 1)
			var ev events
			_, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{a.source(&ev, nil, nil), b.source(&ev, tc.holdErr, tc.releaseErr)})
			if failure := cmpOr(tc.holdErr, tc.releaseErr); !errors.Is(err, failure) || !strings.Contains(err.Error(), b.vol) {
				t.Fatalf("err = %v, want %v naming volume %s", err, failure, b.vol)
			}
			if want := tc.want(a.vol[:4], b.vol[:4]); !slices.Equal(ev, want) {
				t.Fatalf("the group did %q, want %q", ev, want)
			}
			checkNoGroup(t, s, "g", 1)
			after := a.snapshot("after")
			if got := checkDelta(t, s, before, after, DeltaTracked); !slices.Equal(got, []cbt.Extent{{Offset: mib, Length: 64 << 10}}) {
				t.Fatalf("delta across the failed group = %v, want the write before it", got)
			}
			if _, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{a.source(&ev, nil, nil), b.source(&ev, nil, nil)}); err != nil {
				t.Fatalf("retry: %v", err)
			}
		})
	}
}

func cmpOr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkNoGroup fails unless the group name and its members are gone from
// the store and its directories, leaving snaps other snapshots.
func checkNoGroup(t *testing.T, s *Store, name string, snaps int) {
	t.Helper()
	gid := blockdev.GroupSnapshotID(name)
	if _, err := s.GroupSnapshot(gid); !errors.Is(err, blockdev.ErrNotFound) {
		t.Errorf("group %s: %v, want it gone", name, err)
	}
	if n := len(s.Snapshots()); n != snaps {
		t.Errorf("%d snapshots, want %d: %v", n, snaps, s.Snapshots())
	}
	for _, dir := range []string{"meta", "snapshots", changesDir} {
		ents, _ := os.ReadDir(filepath.Join(s.Dir(), dir))
		for _, e := range ents {
			id := strings.SplitN(e.Name(), ".", 2)[0]
			if snap, err := s.Snapshot(id); err == nil && snap.GroupID == "" {
				continue
			}
			if _, err := s.Volume(id); err == nil {
				continue
			}
			t.Errorf("%s/%s left by the group", dir, e.Name())
		}
	}
}

// TestGroupSnapshotSurvivesRestartAndDeletes: a group and its members are
// found again by a restarted store; deleting the group removes them all,
// also after a delete stopped part way (a member already gone).
func TestGroupSnapshotSurvivesRestartAndDeletes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	a, b := twoTracked(t, s)
	g, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{{VolumeID: a.vol}, {VolumeID: b.vol}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir)
	got, err := s.GroupSnapshot(g.ID)
	if err != nil || got.Name != "g" || !slices.Equal(got.Members, g.Members) || !got.CreatedAt.Equal(g.CreatedAt) {
		t.Fatalf("after a restart: %+v, %v; want %+v", got, err, g)
	}
	// A delete that stopped after its first member.
	if err := s.DeleteSnapshot(ctx, g.Members[0].SnapshotID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteGroupSnapshot(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	checkNoGroup(t, s, "g", 0)
	if err := s.DeleteGroupSnapshot(ctx, g.ID); err != nil {
		t.Errorf("second delete: %v, want nil", err)
	}
	s.Close()
	checkNoGroup(t, openStore(t, dir), "g", 0)
}

// TestOpenRemovesHalfMadeGroup: a group whose record still says
// "creating" (a crash before it was complete) is removed with its members
// when the store opens; its volumes stay and the group can be made again.
func TestOpenRemovesHalfMadeGroup(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	a, b := twoTracked(t, s)
	g, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{{VolumeID: a.vol}, {VolumeID: b.vol}})
	if err != nil {
		t.Fatal(err)
	}
	// As a crash between the members' records and the group's leaves it.
	if err := s.writeRecord(g.ID, record{State: stateCreating, Group: &g}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir)
	checkNoGroup(t, s, "g", 0)
	if len(s.Volumes()) != 2 {
		t.Fatalf("volumes after the cleanup: %v, want a and b", s.Volumes())
	}
	if _, err := s.CreateGroupSnapshot(ctx, "g", []GroupSource{{VolumeID: a.vol}, {VolumeID: b.vol}}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

// TestGroupRecordsAreValidated: records that do not describe a complete
// group (or member) are quarantined, never trusted.
func TestGroupRecordsAreValidated(t *testing.T) {
	vid, vid2 := blockdev.VolumeID("a"), blockdev.VolumeID("b")
	gid := blockdev.GroupSnapshotID("g")
	member := func(v string) blockdev.GroupMember {
		return blockdev.GroupMember{VolumeID: v, SnapshotID: blockdev.SnapshotID(blockdev.GroupMemberName(gid, v))}
	}
	ok := blockdev.GroupSnapshot{ID: gid, Name: "g", Members: []blockdev.GroupMember{member(vid), member(vid2)}}
	if vid > vid2 {
		ok.Members[0], ok.Members[1] = ok.Members[1], ok.Members[0]
	}
	if err := (record{State: stateReady, Group: &ok}).validate(gid); err != nil {
		t.Fatalf("a valid group: %v", err)
	}
	bad := map[string]func(g *blockdev.GroupSnapshot){
		"other-id":       func(g *blockdev.GroupSnapshot) { g.ID = blockdev.GroupSnapshotID("h") },
		"other-name":     func(g *blockdev.GroupSnapshot) { g.Name = "h" },
		"no-members":     func(g *blockdev.GroupSnapshot) { g.Members = nil },
		"out-of-order":   func(g *blockdev.GroupSnapshot) { g.Members[0], g.Members[1] = g.Members[1], g.Members[0] },
		"twice":          func(g *blockdev.GroupSnapshot) { g.Members[1] = g.Members[0] },
		"foreign-member": func(g *blockdev.GroupSnapshot) { g.Members[0].SnapshotID = blockdev.SnapshotID("x") },
		"bad-volume":     func(g *blockdev.GroupSnapshot) { g.Members[0].VolumeID = "../x" },
	}
	for label, mutate := range bad {
		t.Run(label, func(t *testing.T) {
			g := ok
			g.Members = slices.Clone(ok.Members)
			mutate(&g)
			if err := (record{State: stateReady, Group: &g}).validate(gid); err == nil {
				t.Fatalf("group %+v accepted", g)
			}
		})
	}
	snap := blockdev.Snapshot{ID: member(vid).SnapshotID, Name: blockdev.GroupMemberName(gid, vid), SourceVolumeID: vid, SizeBytes: mib, GroupID: gid}
	if err := (record{State: stateReady, Snapshot: &snap}).validate(snap.ID); err != nil {
		t.Fatalf("a valid member: %v", err)
	}
	snap.GroupID = blockdev.GroupSnapshotID("h")
	if err := (record{State: stateReady, Snapshot: &snap}).validate(snap.ID); err == nil {
		t.Fatal("a member naming another group than its name's accepted")
	}
	if err := (record{State: stateReady, Group: &ok, Snapshot: &snap}).validate(gid); err == nil {
		t.Fatal("a record of a group and a snapshot accepted")
	}
}
