package dataplane

// TargetKind says what backs a queue.
type TargetKind uint8

const (
	// TargetFile serves I/O from a regular file opened O_RDWR|O_DIRECT.
	TargetFile TargetKind = iota + 1
	// TargetNull completes every request at once with its full byte
	// count and moves no data. For benchmarks only, never for users.
	TargetNull
	// TargetFail completes every request at once with EIO: a device the
	// server keeps but cannot serve (Server.FailingIO).
	TargetFail
)

// Target is the backing store of a device. It is a small value, not an
// interface, so that the queue's per-I/O dispatch is a switch on Kind.
type Target struct {
	Kind TargetKind
	// FD is the backing file (TargetFile): opened O_RDWR|O_DIRECT (or
	// O_RDONLY|O_DIRECT for read-only devices) by the caller, who keeps
	// it open until every queue using it has returned from Wait. Each
	// queue registers it in its own ring, so one fd serves all queues.
	FD int
	// KeepAllocated keeps the file's blocks allocated: WRITE_ZEROES
	// zeroes in place (ZERO_RANGE) even without NOUNMAP, where it would
	// punch a hole (a preallocated volume, whose blocks are its promise
	// of space). The kernel sends WRITE_ZEROES without NOUNMAP for ext4's
	// inode-table zeroing and its zero-out of unwritten extents.
	KeepAllocated bool
}

// FileTarget returns a target that serves I/O from the open file fd.
func FileTarget(fd int) Target { return Target{Kind: TargetFile, FD: fd} }

// NullTarget returns the benchmark-only target that moves no data.
func NullTarget() Target { return Target{Kind: TargetNull, FD: -1} }

// FailTarget returns the target that fails every request with EIO.
func FailTarget() Target { return Target{Kind: TargetFail, FD: -1} }
