package mountinfo

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
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
			if !errors.Is(err, blockdev.ErrInvalid) {
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
