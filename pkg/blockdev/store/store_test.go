package store

import (
	"context"
	"errors"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func TestCreateVolume(t *testing.T) {
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 10<<20 + 1, Params: map[string]string{"k": "v"}})
	t.Run("new", func(t *testing.T) {
		if v.ID != blockdev.VolumeID("a") || v.SizeBytes != 10<<20+4096 {
			t.Fatalf("volume %+v: want ID %s and the rounded size", v, blockdev.VolumeID("a"))
		}
		fi, err := os.Stat(s.VolumeFile(v.ID))
		if err != nil || fi.Size() != v.SizeBytes {
			t.Fatalf("file: %v, %v", fi, err)
		}
		if a := testfs.Allocated(t, s.VolumeFile(v.ID)); a != 0 {
			t.Fatalf("new volume allocates %d bytes, want a sparse file", a)
		}
	})
	t.Run("idempotent", func(t *testing.T) {
		again := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 10<<20 + 4096, Params: map[string]string{"k": "v"}})
		if !reflect.DeepEqual(again, v) {
			t.Fatalf("repeat gave %+v, want %+v", again, v)
		}
	})
	t.Run("idempotent-across-claim-metadata", func(t *testing.T) {
		// The provisioner started passing the claim (an upgrade turned on
		// --extra-create-metadata) while it retried the create.
		again := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 10<<20 + 4096, Params: map[string]string{"k": "v",
			blockdev.ParamPVCName: "data", blockdev.ParamPVCNamespace: "shop", blockdev.ParamPVName: "a"}})
		if again.ID != v.ID {
			t.Fatalf("repeat with claim metadata gave volume %s, want %s", again.ID, v.ID)
		}
	})
	for label, tc := range map[string]struct {
		spec VolumeSpec
		want error
	}{
		"other-size":       {VolumeSpec{Name: "a", SizeBytes: 20 << 20, Params: map[string]string{"k": "v"}}, blockdev.ErrConflict},
		"other-params":     {VolumeSpec{Name: "a", SizeBytes: 10<<20 + 1}, blockdev.ErrConflict},
		"other-source":     {VolumeSpec{Name: "a", SizeBytes: 10<<20 + 1, Params: map[string]string{"k": "v"}, SourceVolumeID: v.ID}, blockdev.ErrConflict},
		"no-name":          {VolumeSpec{SizeBytes: 1 << 20}, blockdev.ErrInvalid},
		"no-size":          {VolumeSpec{Name: "b"}, blockdev.ErrInvalid},
		"negative":         {VolumeSpec{Name: "b", SizeBytes: -1}, blockdev.ErrOutOfRange},
		"too-large":        {VolumeSpec{Name: "b", SizeBytes: blockdev.MaxSize}, blockdev.ErrNoSpace},
		"two-sources":      {VolumeSpec{Name: "b", SizeBytes: 1 << 20, SourceVolumeID: v.ID, SourceSnapshotID: blockdev.SnapshotID("x")}, blockdev.ErrInvalid},
		"missing-snapshot": {VolumeSpec{Name: "b", SourceSnapshotID: blockdev.SnapshotID("nope")}, blockdev.ErrNotFound},
		"missing-volume":   {VolumeSpec{Name: "b", SourceVolumeID: blockdev.VolumeID("nope")}, blockdev.ErrNotFound},
		"bad-source-id":    {VolumeSpec{Name: "b", SourceVolumeID: "../../etc/passwd"}, blockdev.ErrNotFound},
		"snapshot-as-vol":  {VolumeSpec{Name: "b", SourceVolumeID: blockdev.SnapshotID("x")}, blockdev.ErrNotFound},
	} {
		t.Run(label, func(t *testing.T) {
			if _, err := s.CreateVolume(context.Background(), tc.spec); !errors.Is(err, tc.want) {
				t.Fatalf("CreateVolume(%+v) = %v, want %v", tc.spec, err, tc.want)
			}
		})
	}
	if n := len(s.Volumes()); n != 1 {
		t.Fatalf("%d volumes after failed creates, want 1", n)
	}
}

func TestLookups(t *testing.T) {
	s := openStore(t, t.TempDir())
	for _, n := range []string{"c", "a", "b"} {
		mustCreate(t, s, VolumeSpec{Name: n, SizeBytes: 1 << 20, Params: map[string]string{"p": n}})
	}
	vols := s.Volumes()
	if !slices.IsSortedFunc(vols, func(a, b blockdev.Volume) int { return strings.Compare(a.ID, b.ID) }) || len(vols) != 3 {
		t.Fatalf("Volumes() = %d, not sorted by ID", len(vols))
	}
	t.Run("copies", func(t *testing.T) {
		v, _ := s.Volume(blockdev.VolumeID("a"))
		v.Params["p"] = "changed"
		if again, _ := s.Volume(blockdev.VolumeID("a")); again.Params["p"] != "a" {
			t.Fatal("changing a returned Volume changed the store")
		}
	})
	for label, id := range map[string]string{
		"invalid": "../../etc", "unknown": blockdev.VolumeID("zzz"), "snapshot-id": blockdev.SnapshotID("a"), "empty": "",
	} {
		t.Run(label, func(t *testing.T) {
			if _, err := s.Volume(id); !errors.Is(err, blockdev.ErrNotFound) {
				t.Errorf("Volume(%q) = %v, want ErrNotFound", id, err)
			}
			if _, err := s.Snapshot(id); !errors.Is(err, blockdev.ErrNotFound) {
				t.Errorf("Snapshot(%q) = %v, want ErrNotFound", id, err)
			}
			if _, err := s.ExpandVolume(context.Background(), id, 1<<30); !errors.Is(err, blockdev.ErrNotFound) {
				t.Errorf("ExpandVolume(%q) = %v, want ErrNotFound", id, err)
			}
			if _, err := s.UpdateNode(context.Background(), id, blockdev.NodeState{}); !errors.Is(err, blockdev.ErrNotFound) {
				t.Errorf("UpdateNode(%q) = %v, want ErrNotFound", id, err)
			}
			if err := s.DeleteVolume(context.Background(), id, nil); err != nil {
				t.Errorf("DeleteVolume(%q) = %v, want nil", id, err)
			}
			if err := s.DeleteSnapshot(context.Background(), id); err != nil {
				t.Errorf("DeleteSnapshot(%q) = %v, want nil", id, err)
			}
		})
	}
	if f := s.VolumeFile("../x"); f != "" {
		t.Errorf("VolumeFile(../x) = %q, want \"\"", f)
	}
}

func TestDeleteVolume(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	snap := mustSnapshot(t, s, "snap", v.ID)
	t.Run("staged", func(t *testing.T) {
		if _, err := s.UpdateNode(ctx, v.ID, blockdev.NodeState{StagingPath: "/stage", Device: "/dev/loop9"}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteVolume(ctx, v.ID, nil); !errors.Is(err, blockdev.ErrBusy) {
			t.Fatalf("DeleteVolume of a staged volume = %v, want ErrBusy", err)
		}
		if _, err := s.UpdateNode(ctx, v.ID, blockdev.NodeState{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("with-snapshot", func(t *testing.T) {
		if err := s.DeleteVolume(ctx, v.ID, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.VolumeFile(v.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("volume file left behind: %v", err)
		}
		if _, err := os.Stat(s.metaPath(v.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("record left behind: %v", err)
		}
		if _, err := s.Snapshot(snap.ID); err != nil {
			t.Fatalf("snapshot gone with its volume: %v", err)
		}
	})
	t.Run("again", func(t *testing.T) {
		if err := s.DeleteVolume(ctx, v.ID, nil); err != nil {
			t.Fatalf("second DeleteVolume = %v, want nil", err)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		if err := s.DeleteSnapshot(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.dataFile(snap.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("snapshot file left behind: %v", err)
		}
	})
}

func TestExpandVolume(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	v := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 1 << 20})
	for _, tc := range []struct {
		name      string
		ask, want int64
	}{
		{"grow", 3<<20 + 1, 3<<20 + 4096},
		{"same", 3<<20 + 4096, 3<<20 + 4096},
		{"never-shrinks", 1 << 20, 3<<20 + 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ExpandVolume(ctx, v.ID, tc.ask)
			if err != nil || got.SizeBytes != tc.want {
				t.Fatalf("ExpandVolume(%d) = %d, %v; want %d", tc.ask, got.SizeBytes, err, tc.want)
			}
			if fi, err := os.Stat(s.VolumeFile(v.ID)); err != nil || fi.Size() != tc.want {
				t.Fatalf("file size %v, %v; want %d", fi.Size(), err, tc.want)
			}
		})
	}
	t.Run("no-space", func(t *testing.T) {
		if _, err := s.ExpandVolume(ctx, v.ID, blockdev.MaxSize); !errors.Is(err, blockdev.ErrNoSpace) {
			t.Fatalf("ExpandVolume(MaxSize) = %v, want ErrNoSpace", err)
		}
	})
}

func TestModifyVolumeKeepsIdentityAndPersists(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := VolumeSpec{Name: "a", SizeBytes: 1 << 20, Params: map[string]string{"k": "v"},
		MutableParams: map[string]string{"maxIOPS": "100"}}
	v := mustCreate(t, s, spec)
	got, err := s.ModifyVolume(ctx, v.ID, map[string]string{"maxIOPS": "", "maxBandwidth": "10Mi"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"maxBandwidth": "10Mi"}; !maps.Equal(got.MutableParams, want) {
		t.Fatalf("mutable params after modify = %v, want %v (empty value removes)", got.MutableParams, want)
	}
	// The create that made it is still the same volume: mutable
	// parameters are not part of its identity.
	if _, err := s.CreateVolume(ctx, spec); err != nil {
		t.Fatalf("CreateVolume with the original spec after a modify: %v", err)
	}
	again, err := openStore(t, dir).Volume(v.ID)
	if err != nil || !maps.Equal(again.MutableParams, got.MutableParams) {
		t.Fatalf("after reopen: %v, %v; want %v", again.MutableParams, err, got.MutableParams)
	}
	if _, err := s.ModifyVolume(ctx, "vol-missing", nil); !errors.Is(err, blockdev.ErrNotFound) {
		t.Fatalf("ModifyVolume of an unknown volume = %v, want ErrNotFound", err)
	}
}

func TestConcurrentCreate(t *testing.T) {
	s := openStore(t, t.TempDir())
	src := mustCreate(t, s, VolumeSpec{Name: "src", SizeBytes: 8 << 20})
	testfs.WriteAt(t, s.VolumeFile(src.ID), 1<<20, 1<<20, 7)
	const n = 8
	var wg sync.WaitGroup
	got := make([]blockdev.Volume, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			spec := VolumeSpec{Name: "same", SizeBytes: 8 << 20, SourceVolumeID: src.ID}
			if i%2 == 1 { // different names in parallel as well
				spec.Name = "other-" + string(rune('a'+i))
			}
			got[i], errs[i] = s.CreateVolume(context.Background(), spec)
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if i%2 == 0 && !reflect.DeepEqual(got[i], got[0]) {
			t.Fatalf("concurrent creates of one name gave %+v and %+v", got[i], got[0])
		}
	}
	if len(s.Volumes()) != 1+1+n/2 {
		t.Fatalf("%d volumes, want %d", len(s.Volumes()), 2+n/2)
	}
}
