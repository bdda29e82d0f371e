package store

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	unix.Sync()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bfree) * st.Bsize
}

// TestReflinkOnXFS proves that snapshots and clones share extents on a
// reflink filesystem: copying 32 MiB of data costs almost no free space.
func TestReflinkOnXFS(t *testing.T) {
	// xfs needs at least 300 MiB; the image is sparse.
	dir := testfs.MountImage(t, 512<<20, "mkfs.xfs", "-q", "-f", "-m", "reflink=1")
	s := openStore(t, dir)
	src := mustCreate(t, s, VolumeSpec{Name: "src", SizeBytes: 64 << 20})
	for i := range int64(4) {
		testfs.WriteAt(t, s.VolumeFile(src.ID), i*16<<20, 8<<20, byte(i+1))
	}
	const written, most = 32 << 20, 2 << 20
	for _, tc := range []struct {
		name string
		make func() string
	}{
		{"snapshot", func() string { return s.dataFile(mustSnapshot(t, s, "snap", src.ID).ID) }},
		{"clone", func() string {
			return s.VolumeFile(mustCreate(t, s, VolumeSpec{Name: "clone", SourceVolumeID: src.ID}).ID)
		}},
		{"from-snapshot-larger", func() string {
			spec := VolumeSpec{Name: "restore", SizeBytes: 128 << 20, SourceSnapshotID: blockdev.SnapshotID("snap")}
			return s.VolumeFile(mustCreate(t, s, spec).ID)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := freeBytes(t, dir)
			file := tc.make()
			used := before - freeBytes(t, dir)
			if used > most {
				t.Fatalf("%s of %d data bytes used %d bytes of free space: extents not shared", tc.name, written, used)
			}
			if a := testfs.Allocated(t, file); a < written {
				t.Fatalf("%s maps %d bytes, want the %d shared ones", file, a, written)
			}
			testfs.SamePrefix(t, s.VolumeFile(src.ID), file)
			t.Logf("%s: %d data bytes, %d bytes of free space used", tc.name, int64(written), used)
		})
	}
	t.Run("copy-on-write", func(t *testing.T) {
		snapFile, clone := s.dataFile(blockdev.SnapshotID("snap")), s.VolumeFile(blockdev.VolumeID("clone"))
		testfs.WriteAt(t, s.VolumeFile(src.ID), 0, 1<<20, 99)
		testfs.SamePrefix(t, snapFile, clone) // both still hold the data of before
		if err := s.DeleteVolume(context.Background(), src.ID, nil); err != nil {
			t.Fatal(err)
		}
		testfs.SamePrefix(t, snapFile, clone) // and outlive their source
	})
}
