// Package cgroup reads the pids limit of a process's cgroup and how many
// more tasks it may start (PidsHeadroom), under cgroup v2 or v1's pids
// hierarchy: each ublk server thread is a task, so a device is refused
// before the limit would stop a thread. It only reads.
package cgroup
