package fsstat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// The fields of the ext2/3/4 superblock that give the filesystem's size
// (the kernel's struct ext4_super_block, little-endian), and where the
// primary superblock lies on the device.
const (
	extSuperOffset   = 1024
	extSuperSize     = 1024
	extBlocksLo      = 0x04
	extLogBlockSize  = 0x18
	extMagic         = 0x38
	extFeatureInc    = 0x60
	extBlocksHi      = 0x150
	extMagicValue    = 0xEF53
	extIncompat64Bit = 0x80
	// The largest block size the format allows is 64 KiB (10 + 6).
	extMaxLogBlock = 6
)

// ExtSize is the size an ext2/3/4 filesystem records for itself.
type ExtSize struct {
	BlockSize int64
	Blocks    int64
}

// Bytes is the filesystem's size in bytes.
func (s ExtSize) Bytes() int64 { return s.Blocks * s.BlockSize }

// ReadExtSize reads the size of the ext2/3/4 filesystem on the device (or
// image file) at path from its primary superblock. Not mounted, that is
// the size resize2fs would start from; it is compared with the device's to
// tell whether the filesystem fills it. A path holding no ext filesystem
// (unformatted, or another filesystem) returns blockdev.ErrNotFound.
func ReadExtSize(path string) (ExtSize, error) {
	f, err := os.Open(path)
	if err != nil {
		return ExtSize{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	sb := make([]byte, extSuperSize)
	if _, err := f.ReadAt(sb, extSuperOffset); errors.Is(err, io.EOF) {
		return ExtSize{}, fmt.Errorf("%s is too small for an ext superblock: %w", path, blockdev.ErrNotFound)
	} else if err != nil {
		return ExtSize{}, fmt.Errorf("read the superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[extMagic:]) != extMagicValue {
		return ExtSize{}, fmt.Errorf("no ext filesystem on %s: %w", path, blockdev.ErrNotFound)
	}
	logBlock := le.Uint32(sb[extLogBlockSize:])
	if logBlock > extMaxLogBlock {
		return ExtSize{}, fmt.Errorf("ext superblock of %s: block size 2^(10+%d): %w", path, logBlock, blockdev.ErrInvalid)
	}
	blocks := uint64(le.Uint32(sb[extBlocksLo:]))
	if le.Uint32(sb[extFeatureInc:])&extIncompat64Bit != 0 {
		blocks |= uint64(le.Uint32(sb[extBlocksHi:])) << 32
	}
	return ExtSize{BlockSize: 1024 << logBlock, Blocks: int64(blocks)}, nil
}
