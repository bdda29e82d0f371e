package store

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// slack absorbs the few blocks metadata files take.
const slack = 64 << 10

func near(a, b int64) bool { return a-b < slack && b-a < slack }

func capacity(t *testing.T, s *Store) int64 {
	t.Helper()
	avail, _, err := s.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	return avail
}

// TestCapacity runs on a tmpfs of its own so that no other writer moves
// the free space under it.
func TestCapacity(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountTmpfs(t, 64<<20)
	s := openStore(t, dir)
	avail0, total, err := s.Capacity()
	if err != nil || total != 64<<20 || !near(avail0, 64<<20) {
		t.Fatalf("empty: available %d, total %d, %v; want about 64 MiB each", avail0, total, err)
	}
	v := mustCreate(t, s, VolumeSpec{Name: "a", SizeBytes: 16 << 20})
	t.Run("volume-reserves-its-size", func(t *testing.T) {
		if got := capacity(t, s); !near(got, avail0-16<<20) {
			t.Fatalf("available %d after a 16 MiB volume, want about %d", got, avail0-16<<20)
		}
	})
	t.Run("writing-moves-nothing", func(t *testing.T) {
		testfs.WriteAt(t, s.VolumeFile(v.ID), 0, 4<<20, 3)
		if got := capacity(t, s); !near(got, avail0-16<<20) {
			t.Fatalf("available %d after filling 4 MiB of the volume, want about %d", got, avail0-16<<20)
		}
	})
	t.Run("create-refused", func(t *testing.T) {
		_, err := s.CreateVolume(ctx, VolumeSpec{Name: "big", SizeBytes: 60 << 20})
		if !errors.Is(err, blockdev.ErrNoSpace) {
			t.Fatalf("CreateVolume beyond capacity = %v, want ErrNoSpace", err)
		}
	})
	t.Run("expand-refused", func(t *testing.T) {
		if _, err := s.ExpandVolume(ctx, v.ID, 80<<20); !errors.Is(err, blockdev.ErrNoSpace) {
			t.Fatalf("ExpandVolume beyond capacity = %v, want ErrNoSpace", err)
		}
	})
	t.Run("fill-exactly", func(t *testing.T) {
		left := capacity(t, s) - slack
		mustCreate(t, s, VolumeSpec{Name: "rest", SizeBytes: left &^ (blockdev.SizeAlign - 1)})
		if got := capacity(t, s); got > slack {
			t.Fatalf("available %d after using all of it", got)
		}
	})
	t.Run("snapshot-refused", func(t *testing.T) {
		if _, err := s.CreateSnapshot(ctx, "s", v.ID, nil); !errors.Is(err, blockdev.ErrNoSpace) {
			t.Fatalf("CreateSnapshot with no space for the copy = %v, want ErrNoSpace", err)
		}
	})
	t.Run("over-provisioned", func(t *testing.T) {
		o, err := Open(Config{Dir: dir, OverProvisionRatio: 2.5})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := int64(st.Bavail) * st.Bsize
		avail, total, _ := o.Capacity()
		if !near(avail, free*5/2) || total != 160<<20 {
			t.Fatalf("ratio 2.5: available %d, total %d; want %d, %d", avail, total, free*5/2, 160<<20)
		}
		mustCreate(t, o, VolumeSpec{Name: "thin", SizeBytes: 48 << 20}) // more than the disk has free
	})
}

// TestCapacityReserve runs on a real ext4 filesystem on a loop device: the
// reserve is subtracted from the free space before anything is handed out,
// so a create, an expansion or a snapshot that would cut into it is refused,
// and what is left of the filesystem stays free.
func TestCapacityReserve(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountImage(t, 128<<20, "mkfs.ext4", "-q", "-F", "-m", "0")
	const reserve = 48 << 20
	s, err := Open(Config{Dir: dir, ReserveBytes: reserve})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	if got, want := capacity(t, s), free()-reserve; !near(got, want) {
		t.Fatalf("available %d, want free %d less the reserve %d = %d", got, free(), int64(reserve), want)
	}
	left := capacity(t, s) - slack
	v := mustCreate(t, s, VolumeSpec{Name: "fill", SizeBytes: left &^ (blockdev.SizeAlign - 1)})
	if _, err := s.CreateVolume(ctx, VolumeSpec{Name: "into-reserve", SizeBytes: 2 * slack}); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("CreateVolume into the reserve = %v, want ErrNoSpace", err)
	}
	if _, err := s.ExpandVolume(ctx, v.ID, v.SizeBytes+2*slack); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("ExpandVolume into the reserve = %v, want ErrNoSpace", err)
	}
	testfs.WriteAt(t, s.VolumeFile(v.ID), 0, 4<<20, 7)
	if _, err := s.CreateSnapshot(ctx, "snap", v.ID, nil); !errors.Is(err, blockdev.ErrNoSpace) {
		t.Fatalf("CreateSnapshot into the reserve = %v, want ErrNoSpace", err)
	}
	// Filling the volume completely leaves the reserve free.
	testfs.WriteAt(t, s.VolumeFile(v.ID), 0, int(v.SizeBytes), 9)
	if f := free(); f < reserve-slack {
		t.Fatalf("filesystem free %d after filling every volume, want at least the reserve %d", f, int64(reserve))
	}
	if _, err := Open(Config{Dir: t.TempDir(), ReserveBytes: -1}); !errors.Is(err, blockdev.ErrInvalid) {
		t.Fatalf("Open with a negative reserve = %v, want ErrInvalid", err)
	}
	if _, err := Open(Config{Dir: t.TempDir(), ReserveRatio: 1}); !errors.Is(err, blockdev.ErrInvalid) {
		t.Fatalf("Open reserving the whole filesystem = %v, want ErrInvalid", err)
	}
	// A ratio reserves that share of the filesystem's size.
	s.Close()
	r, err := Open(Config{Dir: dir, ReserveRatio: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Blocks) * st.Bsize
	// The volume is fully written: it may take no more.
	if got, want := capacity(t, r), max(free()-size/4, 0); !near(got, want) {
		t.Fatalf("ratio 0.25: available %d, want free %d less a quarter of %d = %d", got, free(), size, want)
	}
}
