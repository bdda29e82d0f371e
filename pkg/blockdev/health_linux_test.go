package blockdev

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseMountInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want MountInfo
	}{
		{
			name: "optional fields",
			line: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue",
			want: MountInfo{MountPoint: "/mnt2", Major: 98, Minor: 0, Root: "/mnt1", FsType: "ext3", Source: "/dev/root",
				MountOptions: []string{"rw", "noatime"}, SuperOptions: []string{"rw", "errors=continue"}},
		},
		{
			name: "no optional fields",
			line: "120 30 7:3 / /var/lib/kubelet/staging rw,relatime - ext4 /dev/loop3 ro,errors=remount-ro",
			want: MountInfo{MountPoint: "/var/lib/kubelet/staging", Major: 7, Minor: 3, Root: "/", FsType: "ext4",
				Source: "/dev/loop3", MountOptions: []string{"rw", "relatime"}, SuperOptions: []string{"ro", "errors=remount-ro"}},
		},
		{
			name: "escaped space and backslash",
			line: `50 1 0:5 /loop3 /pods/a\040b/vol\134x rw,nosuid - devtmpfs udev rw,size=10k`,
			want: MountInfo{MountPoint: `/pods/a b/vol\x`, Major: 0, Minor: 5, Root: "/loop3", FsType: "devtmpfs",
				Source: "udev", MountOptions: []string{"rw", "nosuid"}, SuperOptions: []string{"rw", "size=10k"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMountInfo(strings.NewReader(tc.line + "\n\n"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !sameMount(got[0], tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func sameMount(a, b MountInfo) bool {
	return a.MountPoint == b.MountPoint && a.Major == b.Major && a.Minor == b.Minor && a.Root == b.Root &&
		a.FsType == b.FsType && a.Source == b.Source &&
		slices.Equal(a.MountOptions, b.MountOptions) && slices.Equal(a.SuperOptions, b.SuperOptions)
}

func TestParseMountInfoRejectsMalformed(t *testing.T) {
	for name, line := range map[string]string{
		"no separator":  "36 35 98:0 /mnt1 /mnt2 rw,noatime ext3 /dev/root rw",
		"short tail":    "36 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root",
		"bad device":    "36 35 98-0 /mnt1 /mnt2 rw - ext3 /dev/root rw",
		"short head":    "36 35 98:0 /mnt2 - ext3 /dev/root rw",
		"minor too big": "36 35 1:99999999999 / /m rw - ext3 /dev/root rw",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseMountInfo(strings.NewReader(line))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestFindMountTopmost(t *testing.T) {
	mounts := []MountInfo{
		{MountPoint: "/a", Source: "first"},
		{MountPoint: "/b", Source: "other"},
		{MountPoint: "/a", Source: "second"},
	}
	for _, tc := range []struct {
		name, path, source string
		ok                 bool
	}{
		{"topmost wins", "/a", "second", true},
		{"cleaned path", "/a/", "second", true},
		{"other", "/b", "other", true},
		{"absent", "/c", "", false},
		{"prefix is not a match", "/a/sub", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := FindMount(mounts, tc.path)
			if ok != tc.ok || m.Source != tc.source {
				t.Fatalf("FindMount(%q) = %q, %v; want %q, %v", tc.path, m.Source, ok, tc.source, tc.ok)
			}
		})
	}
}

func TestMountInfoReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name        string
		mount, supr []string
		want        bool
	}{
		{"read-write", []string{"rw", "relatime"}, []string{"rw"}, false},
		{"mount ro", []string{"ro"}, []string{"rw"}, true},
		{"filesystem ro after errors", []string{"rw"}, []string{"ro", "errors=remount-ro"}, true},
		{"errors option alone is not ro", []string{"rw"}, []string{"rw", "errors=remount-ro"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (MountInfo{MountOptions: tc.mount, SuperOptions: tc.supr}).ReadOnly(); got != tc.want {
				t.Fatalf("ReadOnly() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMountsSeesProc(t *testing.T) {
	mounts, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := FindMount(mounts, "/proc")
	if !ok || m.FsType != "proc" {
		t.Fatalf("/proc in the mount table: %+v, %v", m, ok)
	}
}

func TestMountsAt(t *testing.T) {
	dir := mountTmpfs(t, 1<<20)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	plain, gone := t.TempDir(), filepath.Join(t.TempDir(), "gone")
	got, err := MountsAt(dir, link, plain, gone, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, link} {
		if m, ok := got[p]; !ok || m.FsType != "tmpfs" || m.MountPoint != dir {
			t.Errorf("MountsAt[%s] = %+v, %v; want the tmpfs at %s", p, m, ok, dir)
		}
	}
	if len(got) != 2 {
		t.Errorf("MountsAt = %v; want only %s and %s", got, dir, link)
	}
}

func TestDeviceNumber(t *testing.T) {
	t.Run("not a block device", func(t *testing.T) {
		if _, _, err := DeviceNumber(t.TempDir()); !errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, _, err := DeviceNumber(filepath.Join(t.TempDir(), "gone")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v, want ErrNotExist", err)
		}
	})
	t.Run("block device matches its mount", func(t *testing.T) {
		m := mountedExt4(t)
		major, minor, err := DeviceNumber(m.Source)
		if err != nil {
			t.Fatal(err)
		}
		if major != m.Major || minor != m.Minor {
			t.Fatalf("%s is %d:%d, mount table says %d:%d", m.Source, major, minor, m.Major, m.Minor)
		}
	})
}

func TestStatDirAndProbe(t *testing.T) {
	t.Run("writable", func(t *testing.T) {
		dir := t.TempDir()
		st, err := StatDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.ReadOnly || st.TotalBytes <= 0 || st.AvailableBytes > st.TotalBytes {
			t.Fatalf("StatDir = %+v", st)
		}
		if err := ProbeWrite(dir); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("probe left %v behind", ents)
		}
	})
	t.Run("missing directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "gone")
		if _, err := StatDir(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("StatDir: %v, want ErrNotExist", err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("ProbeWrite: %v, want ErrNotExist", err)
		}
	})
	t.Run("read-only filesystem", func(t *testing.T) {
		dir := mountTmpfs(t, 1<<20)
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount ro: %v", err)
		}
		st, err := StatDir(dir)
		if err != nil || !st.ReadOnly {
			t.Fatalf("StatDir = %+v, %v; want read-only", st, err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, unix.EROFS) {
			t.Fatalf("ProbeWrite: %v, want EROFS", err)
		}
	})
	t.Run("full filesystem", func(t *testing.T) {
		dir := mountTmpfs(t, 64<<10)
		err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 68<<10), 0o600)
		if !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("fill: %v, want ENOSPC", err)
		}
		st, err := StatDir(dir)
		if err != nil || st.AvailableBytes != 0 {
			t.Fatalf("StatDir = %+v, %v; want no space", st, err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("ProbeWrite: %v, want ENOSPC", err)
		}
	})
}

// TestExt4Errors reads a fresh ext4's error record, then makes the kernel
// record a real filesystem error (ext4's trigger_fs_error attribute calls
// ext4_error) and reads it again.
func TestExt4Errors(t *testing.T) {
	m := mountedExt4(t)
	e, err := Ext4Errors(m.Major, m.Minor)
	if err != nil || e.Count != 0 {
		t.Fatalf("fresh ext4: %+v, %v; want no errors", e, err)
	}
	trigger := filepath.Join(sysExt4Dir, filepath.Base(m.Source), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("csi-fastblk health test"), 0); err != nil {
		t.Skipf("cannot inject an ext4 error: %v", err)
	}
	// ext4 with errors=continue writes the record to the superblock from
	// a work item (ext4_handle_error, fs/ext4/super.c), so poll for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err = Ext4Errors(m.Major, m.Minor)
		if err == nil && e.Count == 1 && !e.LastTime.IsZero() && e.LastFunc != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an error: %+v, %v; want one error with time and function", e, err)
		}
		<-time.After(10 * time.Millisecond)
	}
	t.Run("not ext4", func(t *testing.T) {
		if _, err := Ext4Errors(m.Major, m.Minor+1000); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("unknown device: %v, want ErrNotExist", err)
		}
	})
}

// mountedExt4 mounts a fresh 32 MiB ext4 image and returns its entry in
// the mount table.
func mountedExt4(t *testing.T) MountInfo {
	t.Helper()
	dir := mountImage(t, 32<<20, "mkfs.ext4", "-q", "-F")
	mounts, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := FindMount(mounts, dir)
	if !ok {
		t.Fatalf("%s not in the mount table", dir)
	}
	return m
}
