package blockdev

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

func openStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(StoreConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustCreate(t *testing.T, s *Store, spec VolumeSpec) Volume {
	t.Helper()
	v, err := s.CreateVolume(context.Background(), spec)
	if err != nil {
		t.Fatalf("CreateVolume(%q): %v", spec.Name, err)
	}
	return v
}

func mustSnapshot(t *testing.T, s *Store, name, src string) Snapshot {
	t.Helper()
	snap, err := s.CreateSnapshot(context.Background(), name, src, nil)
	if err != nil {
		t.Fatalf("CreateSnapshot(%q): %v", name, err)
	}
	return snap
}

// writeAt writes n bytes of a pattern seeded by seed into file at off.
func writeAt(t *testing.T, file string, off int64, n int, seed byte) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i%251)
	}
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// allocated is the bytes of disk the file uses (st_blocks).
func allocated(t *testing.T, file string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// samePrefix checks that b starts with the whole content of a and that the
// rest of b is zero.
func samePrefix(t *testing.T, a, b string) {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(db) < len(da) || !bytes.Equal(da, db[:len(da)]) {
		t.Fatalf("%s does not hold %s's content", b, a)
	}
	if rest := db[len(da):]; !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Fatalf("%s has data past %s's end", b, a)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	testgate.RequireRoot(t)
}

// mountImage makes a filesystem image of size bytes with mkfs (args), loop-
// mounts it on a new directory and returns that directory. Unmounting and
// detaching happen in t.Cleanup.
func mountImage(t *testing.T, size int64, mkfs string, args ...string) string {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath(mkfs); err != nil {
		t.Skipf("%s not installed (apt-get install -y xfsprogs e2fsprogs): %v", mkfs, err)
	}
	img := t.TempDir() + "/fs.img"
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	run(t, mkfs, append(args, img)...)
	dir := t.TempDir()
	run(t, "mount", "-o", "loop", img, dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// mountTmpfs mounts a tmpfs of size bytes: a filesystem of its own whose
// free space only this test changes.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func recordJSON(t *testing.T, r record) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
