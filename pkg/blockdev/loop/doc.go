// Package loop attaches regular files to kernel loop devices (/dev/loopN)
// through the loop ioctls in golang.org/x/sys/unix, and finds them again
// through sysfs.
//
// Devices are configured in one LOOP_CONFIGURE call (Linux 5.8+) with direct
// I/O and a chosen logical block size; kernels that refuse LOOP_CONFIGURE get
// the older LOOP_SET_FD, LOOP_SET_STATUS64, LOOP_SET_BLOCK_SIZE and
// LOOP_SET_DIRECT_IO sequence (probe by doing, no version checks).
// LO_FLAGS_AUTOCLEAR is never set, so a device outlives the process that made
// it. It is found again by the mark its maker stored as lo_file_name
// (Options.Mark, read back with LOOP_GET_STATUS64), not by its backing file
// (/sys/block/loopN/loop/backing_file): any user of the kernel can bind the
// same path.
//
// Each Attach makes a new device (LOOP_CTL_ADD) and Detach removes it
// (LOOP_CTL_REMOVE), rather than reusing free ones: the kernel keeps a
// device's I/O counters across detach and re-attach, and a file's counters
// must count its own I/O only.
//
// The package knows nothing of volumes or CSI. It holds no state and no file
// descriptors between calls; every function is safe for concurrent use, and
// concurrent attaches that race for the same free device retry.
package loop
