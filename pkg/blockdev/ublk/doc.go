// Package ublk is csi-fastblk's ublk server: it turns a volume file into a
// /dev/ublkbN block device served by this process through the uring engine.
// It knows ublk and io_uring, nothing of CSI.
//
// # Layers
//
//   - internal/uapi: the UAPI of include/uapi/linux/ublk_cmd.h (7.3),
//     shared with the data plane (uapi.go re-exports what callers see).
//   - Control (ctrl_linux.go): /dev/ublk-control and SQE128 rings for
//     control commands, one per command in flight so that a slow command
//     holds up no other, each bounded by a timeout; payloads live in
//     mmap'd pages, never in Go heap memory.
//   - features_linux.go: GET_FEATURES, the kernel floor (Linux 6.5+) and the
//     choice of ADD_DEV flags (user recovery with reissue, UPDATE_SIZE,
//     QUIESCE, AUTO_BUF_REG zero copy and BATCH_IO where offered).
//   - Device (device_linux.go, recovery_linux.go): one device's life.
//     Create: ADD_DEV → record → open /dev/ublkcN → SET_PARAMS → one
//     dataplane.Queue per hardware queue, spread over the server threads →
//     START_DEV → /dev/ublkbN. Delete: STOP_DEV → queues drain on -ENODEV →
//     close → DEL_DEV_ASYNC. Release: queues leave, the device stays
//     QUIESCED. Recover: START_USER_RECOVERY (retried while the old fd is
//     released) → reopen → queues → END_USER_RECOVERY.
//   - internal/dataplane: the data plane. Shared server threads (one per
//     CPU the process may use, fewer under a cgroup CPU limit), each one
//     locked OS thread and one io_uring, serve the queues of every device; per request: descriptor →
//     backing I/O → COMMIT_AND_FETCH. It also holds back reads and writes
//     that the device's rate limits (pkg/blockdev/qos) do not let start
//     yet. dataplane.go re-exports the types callers configure.
//   - Change records (changes_linux.go): each device's cbt.Tracker, a
//     bitmap per queue that the data plane marks; cut for a snapshot (with
//     the device's I/O held), handed over at a clean detach, and at a
//     stop by HandOver or Close (in the device's state file, stamped with
//     the backing file's change time, for the next process); untrusted
//     after a re-adoption without one.
//   - ChooseTuning (tuning.go): queues and depth from CPUs and a memory
//     budget; the one place the policy is stated.
//   - Server (server_linux.go, state.go): the devices of one plugin
//     instance, by volume ID, recorded in a state directory so a restarted
//     process re-adopts them and sweeps those whose volume is gone. A
//     device that holds its I/O (a failed server thread or queue, a
//     re-adoption that could not finish) makes Health fail
//     (health_linux.go). The devices of a server thread that fails are
//     re-adopted in the process, through user recovery, onto the other
//     threads and one started in its place (threadheal_linux.go); Health
//     fails until they are, and stays failed, so that the plugin is
//     restarted, where that is impossible. A device it keeps but cannot
//     re-adopt (no readable state names it) fails its I/O after a bound
//     instead of holding it (unserved_linux.go).
//
// # Ownership
//
// Every device this package creates carries an owner token
// (ServerConfig.Owner: the blockdev layer persists a random one in the data
// directory) in dev_info.ublksrv_flags, which the kernel keeps for the
// server. Devices whose token differs are never stopped, deleted or
// recovered; an owned device is deleted only when the server knows its
// volume is gone or that it was never started, never because a state file
// could not be read (such a file is set aside, see Quarantined).
//
// Errors wrap errnos (unix.Errno) and standard sentinels (os.ErrInvalid,
// os.ErrNotExist, os.ErrExist, errors.ErrUnsupported); the blockdev adapter
// maps them to its classes.
package ublk
