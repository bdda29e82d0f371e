package blockdev

import (
	"fmt"
	"os"
	"time"
)

// BackendConfig configures whichever backend is selected.
type BackendConfig struct {
	// DataDir is the Store's data directory; backends only list and
	// adopt devices whose backing files live under it.
	DataDir string
	// Owner marks the devices of this data directory; backends only list,
	// adopt and detach devices carrying it. Zero means
	// OwnerToken(DataDir).
	Owner uint64
	// AdoptUnmarked (loop only) marks as ours, once per data directory,
	// the loop devices a plugin without owner marks bound to this
	// directory's volume files (their lo_file_name is their path, and
	// their backing inode is the volume file's), so that the upgraded
	// plugin finds the devices of staged volumes again. Done is recorded
	// in <DataDir>/loop-marked; later starts skip it, since losetup
	// names devices the same way. The plugin sets it; tests of foreign
	// devices leave it off.
	AdoptUnmarked bool
	// DevDir holds the stable links <DevDir>/<volume-id> (default /dev/fastblk).
	DevDir string
	// Default tuning when a volume does not ask for its own (zero = auto).
	Tuning Tuning
	// Poll (ublk only) bounds how long a queue thread polls for
	// completions after a busy round before it sleeps (see
	// ublk.QueueOptions.Poll). It trades CPU time for latency; 0 never
	// polls.
	Poll time.Duration
	// BatchIO (ublk only) is "on", "auto" (where the kernel offers it) or
	// "off" ("" = off): new devices fetch and commit requests in batches
	// (see ublk.ServerConfig.BatchIO).
	BatchIO string
	// Threads (ublk only) is how many server threads serve every
	// device's queues; 0 means one per CPU the plugin may use.
	// ThreadPerQueue gives each queue a thread of its own instead, the
	// design before shared threads, for benchmark comparisons.
	Threads        int
	ThreadPerQueue bool
}

// UblkControl is the ublk control device; its presence selects ublk in "auto".
const UblkControl = "/dev/ublk-control"

// NewBackend returns the backend named kind: "loop", "ublk", or "auto"
// (ublk when /dev/ublk-control exists, loop otherwise).
func NewBackend(kind string, cfg BackendConfig) (Backend, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%s backend: no data directory: %w", kind, ErrInvalid)
	}
	if cfg.Owner == 0 {
		err := os.MkdirAll(cfg.DataDir, 0o700)
		if err == nil {
			cfg.Owner, err = OwnerToken(cfg.DataDir)
		}
		if err != nil {
			return nil, fmt.Errorf("%s backend: %w", kind, err)
		}
	}
	switch kind {
	case "auto":
		if _, err := os.Stat(UblkControl); err == nil {
			return newUblkBackend(cfg)
		}
		return newLoopBackend(cfg)
	case "ublk":
		return newUblkBackend(cfg)
	case "loop":
		return newLoopBackend(cfg)
	}
	return nil, fmt.Errorf("backend %q: %w (want auto, ublk or loop)", kind, ErrInvalid)
}
