package mountinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// This file holds the kernel-facing probes behind the driver's health
// reporting: the mount table, device numbers, the data directory's
// filesystem and a write probe. They read state; none of them changes
// anything but the probe file they remove again.

// MountInfo is one line of /proc/self/mountinfo (proc_pid_mountinfo(5)).
type MountInfo struct {
	// MountPoint is the mount's path in this process's mount namespace.
	MountPoint string
	// Major and Minor identify the filesystem's device (st_dev).
	Major, Minor uint32
	// Root is the path inside the filesystem that is mounted (a bind
	// mount of a subdirectory or of a device node has Root != "/").
	Root   string
	FsType string
	Source string
	// MountOptions are the per-mount options, SuperOptions those of the
	// filesystem (superblock). An ext4 "errors=remount-ro" shows up as
	// "ro" in SuperOptions only.
	MountOptions []string
	SuperOptions []string
	// Shared is set for a mount in a peer group ("shared:N"): mounts and
	// unmounts beneath it propagate to its peers, which may be in other
	// mount namespaces.
	Shared bool
}

// ReadOnly reports whether writes through this mount fail with EROFS:
// the mount or its filesystem is read-only.
func (m MountInfo) ReadOnly() bool {
	return slices.Contains(m.MountOptions, "ro") || slices.Contains(m.SuperOptions, "ro")
}

// mountInfoPath is the calling process's mount table.
const mountInfoPath = "/proc/self/mountinfo"

// Mounts reads the calling process's mount table.
func Mounts() ([]MountInfo, error) {
	b, err := os.ReadFile(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return ParseMountInfo(bytes.NewReader(b))
}

// ParseMountInfo parses the mountinfo format, in the kernel's order (later
// lines are mounted later, so they cover earlier ones at the same path).
func ParseMountInfo(r io.Reader) ([]MountInfo, error) {
	var out []MountInfo
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		m, err := parseMountLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// parseMountLine parses
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// (ID, parent, major:minor, root, mount point, options, optional fields,
// "-", type, source, super options).
func parseMountLine(line string) (MountInfo, error) {
	f := strings.Fields(line)
	sep := slices.Index(f, "-")
	if sep < 6 || len(f) < sep+4 {
		return MountInfo{}, fmt.Errorf("%q: %w", line, blockdev.ErrInvalid)
	}
	maj, min, ok := strings.Cut(f[2], ":")
	major, err1 := strconv.ParseUint(maj, 10, 32)
	minor, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return MountInfo{}, fmt.Errorf("device %q: %w", f[2], blockdev.ErrInvalid)
	}
	shared := slices.ContainsFunc(f[6:sep], func(o string) bool { return strings.HasPrefix(o, "shared:") })
	return MountInfo{
		Shared:       shared,
		MountPoint:   unescapeMount(f[4]),
		Major:        uint32(major),
		Minor:        uint32(minor),
		Root:         unescapeMount(f[3]),
		FsType:       f[sep+1],
		Source:       unescapeMount(f[sep+2]),
		MountOptions: strings.Split(f[5], ","),
		SuperOptions: strings.Split(f[sep+3], ","),
	}, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space, \011,
// \012, \134) in mountinfo paths (fs/proc_namespace.c, mangle()).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FindMount returns the topmost mount at path (the last one in the table),
// comparing cleaned paths.
func FindMount(mounts []MountInfo, path string) (MountInfo, bool) {
	path = filepath.Clean(path)
	for _, m := range slices.Backward(mounts) {
		if m.MountPoint == path {
			return m, true
		}
	}
	return MountInfo{}, false
}

// MountsAt maps each of paths to the topmost mount there, following
// symlinks in the path as the mount table lists resolved paths. Paths that
// are not mount points, and "", have no key.
func MountsAt(paths ...string) (map[string]MountInfo, error) {
	all, err := Mounts()
	if err != nil {
		return nil, err
	}
	out := map[string]MountInfo{}
	for _, p := range paths {
		if p == "" {
			continue
		}
		resolved, err := filepath.EvalSymlinks(p)
		if err != nil {
			resolved = p // gone or unreadable: look it up as given
		}
		if m, ok := FindMount(all, resolved); ok {
			out[p] = m
		}
	}
	return out, nil
}
