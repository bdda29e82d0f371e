package blkdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stats are the kernel's own I/O counters for a block device, from
// /sys/block/<dev>/stat (Documentation/block/stat.rst). They work for every
// backend, since loop and ublk devices are both ordinary gendisks.
type Stats struct {
	ReadIOs, ReadSectors, ReadTicksMs    uint64
	WriteIOs, WriteSectors, WriteTicksMs uint64
	DiscardIOs, DiscardSectors, FlushIOs uint64
	InFlight                             uint64
	IOTicksMs                            uint64
}

// ReadStats reads the counters of the device at path (a node such as
// /dev/loop3 or a link to one).
func ReadStats(path string) (Stats, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return Stats{}, fmt.Errorf("resolve %s: %w", path, err)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(real), "stat"))
	if err != nil {
		return Stats{}, fmt.Errorf("disk stats of %s: %w", real, err)
	}
	return parseStats(string(b))
}

// parseStats parses the 11 to 17 fields of a /sys/block/<dev>/stat line.
func parseStats(s string) (Stats, error) {
	f := strings.Fields(s)
	if len(f) < 11 {
		return Stats{}, fmt.Errorf("disk stats %q: want at least 11 fields", s)
	}
	n := make([]uint64, 17)
	for i := 0; i < len(f) && i < len(n); i++ {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("disk stats field %d %q: %w", i, f[i], err)
		}
		n[i] = v
	}
	return Stats{
		ReadIOs: n[0], ReadSectors: n[2], ReadTicksMs: n[3],
		WriteIOs: n[4], WriteSectors: n[6], WriteTicksMs: n[7],
		InFlight: n[8], IOTicksMs: n[9],
		DiscardIOs: n[11], DiscardSectors: n[13], FlushIOs: n[15],
	}, nil
}
