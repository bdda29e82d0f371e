// Package kernel names the running kernel (Release, uname -r) for logs,
// status and the benchmarks' records.
package kernel
