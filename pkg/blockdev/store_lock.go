package blockdev

import (
	"path/filepath"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// OwnerToken (stub: the old path-derived token).
func OwnerToken(dataDir string) (uint64, error) {
	return ublk.OwnerToken(filepath.Join(dataDir, UblkStateDir)), nil
}

// Close (stub).
func (s *Store) Close() error { return nil }

// Quarantined (stub).
func (s *Store) Quarantined() []string { return nil }

const ownerFile = "owner"
const staleTemp = time.Minute
