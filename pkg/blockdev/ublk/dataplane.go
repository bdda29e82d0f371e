package ublk

import (
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// The data plane (internal/dataplane) serves the devices this package
// creates; these are the parts of it that callers configure and observe
// through Server and Device.

type (
	// Target is a device's backing store: FileTarget or NullTarget.
	Target = dataplane.Target
	// QueueOptions are the queues' buffer, submission and wait policy.
	QueueOptions = dataplane.QueueOptions
	// QueueStats are one queue's counters.
	QueueStats = dataplane.QueueStats
	// ThreadConfig sizes and tunes every shared server thread.
	ThreadConfig = dataplane.ThreadConfig
	// ThreadStats are one server thread's counters.
	ThreadStats = dataplane.ThreadStats
	// Ablation switches techniques of the data plane off (benchmarks;
	// empty without -tags ablation).
	Ablation = dataplane.Ablation
)

// FileTarget serves the device from the open file fd.
func FileTarget(fd int) Target { return dataplane.FileTarget(fd) }

// NullTarget completes every request at once without backing I/O.
func NullTarget() Target { return dataplane.NullTarget() }

// FailTarget fails every request with EIO.
func FailTarget() Target { return dataplane.FailTarget() }

// DefaultIdleReclaim is QueueOptions.IdleReclaim's default.
const DefaultIdleReclaim = dataplane.DefaultIdleReclaim

// LatencyBuckets are the upper bounds of QueueStats' latency histogram.
var LatencyBuckets = dataplane.LatencyBuckets
