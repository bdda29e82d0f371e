package fsstat

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"
)

// Stats is what statfs reports of the filesystem holding a path.
type Stats struct {
	// AvailableBytes is what unprivileged users may still write, as the
	// Store counts; byte counts saturate at math.MaxInt64.
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
	// ReadOnly: mounted, or remounted after errors, read-only.
	ReadOnly bool
}

// Stat reads the size, use and read-only flag of the filesystem holding
// path (statfs(2); ST_RDONLY covers both the mount and the filesystem
// being read-only): a mounted volume's, or the data directory's.
func Stat(path string) (Stats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Stats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return Stats{
		TotalBytes:     mulSat(int64(st.Blocks), st.Bsize),
		AvailableBytes: mulSat(int64(st.Bavail), st.Bsize),
		UsedBytes:      mulSat(int64(st.Blocks-st.Bfree), st.Bsize),
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
		ReadOnly:       st.Flags&unix.ST_RDONLY != 0,
	}, nil
}

// AllocatedBytes returns the bytes of disk the file at path occupies
// (st_blocks of 512 bytes): less than its size while it is sparse, more
// when the filesystem allocated ahead.
func AllocatedBytes(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

func mulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
