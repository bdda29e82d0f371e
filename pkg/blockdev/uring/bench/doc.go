// Package bench measures the uring engine against a file the way fio does:
// each job is one goroutine locked to its OS thread with its own ring, its
// own O_DIRECT fd and iodepth page-aligned buffers, keeping iodepth I/Os of
// bs bytes in flight for a fixed runtime. It reports IOPS, bandwidth,
// completion-latency percentiles (fio's clat: submit to reap), context
// switches and io_uring_enter calls per I/O.
//
// Run is not safe for concurrent use with itself on the same file only in
// the sense that results would mix; it owns every fd, ring and buffer it
// creates and releases them before returning.
package bench
