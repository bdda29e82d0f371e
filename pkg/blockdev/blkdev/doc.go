// Package blkdev answers questions about block device nodes: their device
// numbers, size, the kernel's disk counters (/sys/block/<dev>/stat), and
// sets their read-only flag. It works for every backend's devices, which
// are all ordinary gendisks.
package blkdev
