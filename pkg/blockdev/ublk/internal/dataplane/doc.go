// Package dataplane serves the I/O of the ublk devices that package ublk
// creates: the shared server threads (Thread, Threads) that each run one
// io_uring, the Queue of each hardware queue they serve, the request
// descriptors and buffers the kernel shares with them, and the queues'
// rate limits, pause gate and counters. Package ublk owns everything else
// (control commands, a device's life, its state files and recovery) and
// hands each queue to a thread here; nothing here knows of devices beyond
// the fds and sizes in QueueConfig.
//
// One Queue per hardware queue of a device is served by a server thread
// (thread_linux.go) that may serve the queues of many devices.
//
// Setting a queue up: the caller maps the queue's descriptors read-only and
// its copy-mode buffers, then hands the queue to its thread, which gives it
// two fixed-file slots ([ublkc, backing]) and a run of buffer slots in its
// ring, registers the heads of its buffers there (copy mode) and FETCHes
// every tag. That thread is then the queue's ublk daemon: every IO command
// and every backing operation is issued from it, and it waits on nothing
// but io_uring_enter: what may wait on a filesystem (the backing file's
// mtime, freshenMtime) runs off the thread. It still registers the heads
// of copy-mode buffers with io_uring_register when a tag first needs them
// (registerHead): that pins pages of our own memory, at most once per tag
// and size.
//
// Per request (queue_io_linux.go): the tag's completion → decode the
// descriptor (desc.go) → one backing SQE (READ/WRITE, FSYNC DATASYNC,
// FALLOCATE) → its completion → COMMIT_AND_FETCH with the full byte count
// or -errno. Short transfers are continued, -EAGAIN retried. A WRITE,
// DISCARD or WRITE_ZEROES marks its range in the queue's change bitmap
// (QueueConfig.Changes, package cbt) as its backing operation is issued.
// Nothing on this path allocates. With UBLK_F_BATCH_IO (Linux 7.0+) requests come in
// batches through one multishot FETCH and a round's results go back in one
// COMMIT (queue_batch_linux.go).
//
// Buffers: with UBLK_F_AUTO_BUF_REG (Linux 6.16+) the kernel registers each
// request's pages in the thread ring's buffer table, in the queue's slot
// for the tag, and the backing I/O is READ_FIXED/WRITE_FIXED on them (zero
// copy; no buffers of ours). Otherwise each tag has a MaxIOBytes buffer in
// one anonymous mapping and the driver copies between it and the request
// (copy mode); pages become resident on first use, except the heads that
// Options.FixedBuffers registers (pins) at start.
//
// Ending: STOP_DEV (or QUIESCE_DEV) aborts every parked tag with -ENODEV;
// once all tags are aborted and no backing I/O is in flight, the thread
// clears the queue's slots and Wait returns nil. Closing a thread closes
// its ring, which cancels the parked commands of every queue on it, so a
// device with USER_RECOVERY stays QUIESCED for the next process.
package dataplane
