package blockdev

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"unicode/utf8"
)

// Object IDs are derived from names so that a retried create lands on the
// same object: a kind prefix ("v" for volumes, "s" for snapshots, "g" for
// group snapshots) followed by
// the lowercase hex of the first 16 bytes of sha256(name). IDs are 33 bytes of
// [0-9a-f] after the prefix, so no ID can name a path outside the data
// directory. Everything that turns an ID into a path calls ValidID first.
const (
	volumePrefix   = 'v'
	snapshotPrefix = 's'
	groupPrefix    = 'g'
	idHexLen       = 32
	idLen          = 1 + idHexLen

	// MaxNameLen is the longest name accepted, in bytes (the CSI limit).
	MaxNameLen = 128
	// SizeAlign is the unit sizes are rounded up to: volumes and devices
	// are whole 4 KiB blocks so that 4 KiB-sector devices and O_DIRECT work.
	SizeAlign = 4096
	// MaxSize is the largest size accepted (the largest aligned int64).
	MaxSize = math.MaxInt64 &^ (SizeAlign - 1)
)

// VolumeID returns the ID of the volume named name.
func VolumeID(name string) string { return deriveID(volumePrefix, name) }

// SnapshotID returns the ID of the snapshot named name.
func SnapshotID(name string) string { return deriveID(snapshotPrefix, name) }

// GroupSnapshotID returns the ID of the group snapshot named name.
func GroupSnapshotID(name string) string { return deriveID(groupPrefix, name) }

func deriveID(prefix byte, name string) string {
	sum := sha256.Sum256([]byte(name))
	return string(prefix) + hex.EncodeToString(sum[:idHexLen/2])
}

// ValidID reports whether id has the shape of a volume, snapshot or group
// snapshot ID. IDs that are not valid never reach a path: the Store
// answers ErrNotFound for them (the deletes answer nil, as for unknown
// IDs).
func ValidID(id string) bool {
	return IsVolumeID(id) || IsSnapshotID(id) || IsGroupSnapshotID(id)
}

// IsVolumeID reports whether id has the shape of a volume ID.
func IsVolumeID(id string) bool { return len(id) == idLen && id[0] == volumePrefix && isHex(id[1:]) }

// IsSnapshotID reports whether id has the shape of a snapshot ID.
func IsSnapshotID(id string) bool {
	return len(id) == idLen && id[0] == snapshotPrefix && isHex(id[1:])
}

// IsGroupSnapshotID reports whether id has the shape of a group snapshot ID.
func IsGroupSnapshotID(id string) bool {
	return len(id) == idLen && id[0] == groupPrefix && isHex(id[1:])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CheckName accepts names of 1 to MaxNameLen bytes of valid UTF-8 (any
// characters; protobuf strings are UTF-8, and metadata is JSON, which
// could not keep other bytes intact).
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("name is empty: %w", ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("name is %d bytes, more than %d: %w", len(name), MaxNameLen, ErrInvalid)
	case !utf8.ValidString(name):
		return fmt.Errorf("name is not valid UTF-8: %w", ErrInvalid)
	}
	return nil
}

// RoundSize rounds n up to a multiple of SizeAlign. Sizes the Store records
// and reports are always rounded; callers report the rounded size.
func RoundSize(n int64) (int64, error) {
	if n < 0 || n > MaxSize {
		return 0, fmt.Errorf("size %d outside [0, %d]: %w", n, int64(MaxSize), ErrOutOfRange)
	}
	return (n + SizeAlign - 1) &^ (SizeAlign - 1), nil
}
