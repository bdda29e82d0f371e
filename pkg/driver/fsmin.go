package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// minFilesystemBytes is the smallest device each filesystem's mkfs formats.
// A mount volume smaller than that is created fine and then fails every
// NodeStageVolume, so CreateVolume rounds it up (within limit_bytes).
//   - xfs: 300 MiB since xfsprogs 5.19 ("mkfs: increase the minimum
//     supported filesystem size to 300MB"; Debian bookworm's 6.1.0 refuses
//     314572799 bytes and formats 314572800); older xfsprogs took 16 MiB.
//   - ext4: mke2fs 1.47 formats 128 KiB and refuses 64 KiB.
var minFilesystemBytes = map[string]int64{
	"xfs":  300 << 20,
	"ext4": 128 << 10,
}

// fitFilesystem raises size, chosen by sizeFor from cr, to the smallest
// device the filesystem of every mount capability can be made on, or
// answers OutOfRange when limit_bytes is below that.
func fitFilesystem(size int64, cr *csi.CapacityRange, caps []*csi.VolumeCapability, params map[string]string) (int64, error) {
	for _, c := range caps {
		if c.GetMount() == nil {
			continue
		}
		fs := fsTypeFor(c, params)
		min := minFilesystemBytes[fs]
		if size >= min {
			continue
		}
		if lim := cr.GetLimitBytes(); lim > 0 && lim < min {
			return 0, status.Errorf(codes.OutOfRange, "a %s filesystem needs a volume of at least %d bytes; limit bytes %d is below it",
				fs, min, lim)
		}
		size = min
	}
	return size, nil
}
