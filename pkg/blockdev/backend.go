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
