// Package kernel names the running kernel (Release, uname -r) for logs,
// status and the benchmarks' records, and loads its modules (LoadModule:
// ublk_drv where the node has it but did not load it), saying why when it
// cannot.
package kernel
