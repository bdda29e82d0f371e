// io_uring UAPI, transcribed by hand from include/uapi/linux/io_uring.h as
// shipped in Debian linux-libc-dev 6.1.187 (/usr/include/linux/io_uring.h).
// Only what the engine and its ublk consumer use is here. zuapi_test.go
// checks every struct size and field offset against the C layout.
//
// Constant names keep their C spelling so they can be grepped against the
// header. Structs embed structs.HostLayout so the compiler keeps C layout.

package uring

import "structs"

// Setup flags (io_uring_params.flags).
const (
	IORING_SETUP_IOPOLL        = 1 << 0
	IORING_SETUP_SQPOLL        = 1 << 1
	IORING_SETUP_CQSIZE        = 1 << 3
	IORING_SETUP_CLAMP         = 1 << 4
	IORING_SETUP_R_DISABLED    = 1 << 6
	IORING_SETUP_SUBMIT_ALL    = 1 << 7
	IORING_SETUP_COOP_TASKRUN  = 1 << 8
	IORING_SETUP_TASKRUN_FLAG  = 1 << 9
	IORING_SETUP_SQE128        = 1 << 10
	IORING_SETUP_CQE32         = 1 << 11
	IORING_SETUP_SINGLE_ISSUER = 1 << 12
	IORING_SETUP_DEFER_TASKRUN = 1 << 13
)

// SQE flags (io_uring_sqe.flags).
const (
	IOSQE_FIXED_FILE       = 1 << 0
	IOSQE_IO_DRAIN         = 1 << 1
	IOSQE_IO_LINK          = 1 << 2
	IOSQE_IO_HARDLINK      = 1 << 3
	IOSQE_ASYNC            = 1 << 4
	IOSQE_BUFFER_SELECT    = 1 << 5
	IOSQE_CQE_SKIP_SUCCESS = 1 << 6
)

// Opcodes (enum io_uring_op).
const (
	IORING_OP_NOP          = 0
	IORING_OP_READV        = 1
	IORING_OP_WRITEV       = 2
	IORING_OP_FSYNC        = 3
	IORING_OP_READ_FIXED   = 4
	IORING_OP_WRITE_FIXED  = 5
	IORING_OP_POLL_ADD     = 6
	IORING_OP_POLL_REMOVE  = 7
	IORING_OP_TIMEOUT      = 11
	IORING_OP_ASYNC_CANCEL = 14
	IORING_OP_FALLOCATE    = 17
	IORING_OP_CLOSE        = 19
	IORING_OP_READ         = 22
	IORING_OP_WRITE        = 23
	IORING_OP_MSG_RING     = 40
	IORING_OP_URING_CMD    = 46
	IORING_OP_LAST         = 49 // last opcode in the 6.1 header (exclusive)
)

// Per-opcode flags.
const (
	IORING_URING_CMD_FIXED     = 1 << 0 // uring_cmd_flags: buf_index is valid
	IORING_URING_CMD_MULTISHOT = 1 << 1 // uring_cmd_flags: multishot, with IOSQE_BUFFER_SELECT
	IORING_FSYNC_DATASYNC      = 1 << 0 // fsync_flags: fdatasync
	IORING_POLL_ADD_MULTI      = 1 << 0 // len of a POLL_ADD: multishot
)

// CQE flags (io_uring_cqe.flags).
const (
	IORING_CQE_F_BUFFER = 1 << 0
	IORING_CQE_F_MORE   = 1 << 1
)

// mmap offsets of the three regions.
const (
	IORING_OFF_SQ_RING = 0
	IORING_OFF_CQ_RING = 0x8000000
	IORING_OFF_SQES    = 0x10000000
)

// sq_flags bits.
const (
	IORING_SQ_NEED_WAKEUP = 1 << 0
	IORING_SQ_CQ_OVERFLOW = 1 << 1
	IORING_SQ_TASKRUN     = 1 << 2
)

// io_uring_enter flags.
const (
	IORING_ENTER_GETEVENTS       = 1 << 0
	IORING_ENTER_SQ_WAKEUP       = 1 << 1
	IORING_ENTER_SQ_WAIT         = 1 << 2
	IORING_ENTER_EXT_ARG         = 1 << 3
	IORING_ENTER_REGISTERED_RING = 1 << 4
)

// Features (io_uring_params.features).
const (
	IORING_FEAT_SINGLE_MMAP = 1 << 0
	IORING_FEAT_NODROP      = 1 << 1
	IORING_FEAT_EXT_ARG     = 1 << 8
	IORING_FEAT_CQE_SKIP    = 1 << 11
)

// io_uring_register opcodes.
const (
	IORING_REGISTER_BUFFERS          = 0
	IORING_UNREGISTER_BUFFERS        = 1
	IORING_REGISTER_FILES            = 2
	IORING_UNREGISTER_FILES          = 3
	IORING_REGISTER_PROBE            = 8
	IORING_REGISTER_FILES2           = 13
	IORING_REGISTER_FILES_UPDATE2    = 14
	IORING_REGISTER_BUFFERS2         = 15
	IORING_REGISTER_BUFFERS_UPDATE   = 16
	IORING_REGISTER_IOWQ_MAX_WORKERS = 19
	IORING_REGISTER_RING_FDS         = 20
	IORING_UNREGISTER_RING_FDS       = 21
	IORING_REGISTER_PBUF_RING        = 22
	IORING_UNREGISTER_PBUF_RING      = 23
)

// IORING_CQE_BUFFER_SHIFT: a CQE with IORING_CQE_F_BUFFER carries the
// selected buffer's id in flags >> 16.
const IORING_CQE_BUFFER_SHIFT = 16

// Misc.
const (
	IORING_RSRC_REGISTER_SPARSE = 1 << 0
	IO_URING_OP_SUPPORTED       = 1 << 0
)

// SQE is struct io_uring_sqe (64 bytes). Unions are represented by their
// first or most useful member: Off is off/addr2 (and cmd_op in its low 32
// bits for URING_CMD); OpFlags is rw_flags/fsync_flags/poll32_events/
// uring_cmd_flags...; BufIndex is buf_index/buf_group; FileIndex is
// splice_fd_in/file_index. The 16 bytes at offset 48 (Addr3, Pad2) are also
// cmd[] for URING_CMD: see Cmd.
type SQE struct {
	_           structs.HostLayout
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	FileIndex   uint32
	Addr3       uint64
	Pad2        uint64
}

// SQE128 is one entry of an IORING_SETUP_SQE128 ring: a 64-byte SQE
// followed by 64 more bytes of command area.
type SQE128 struct {
	_   structs.HostLayout
	SQE SQE
	Ext [64]byte
}

// CQE is struct io_uring_cqe (16 bytes, no CQE32).
type CQE struct {
	_        structs.HostLayout
	UserData uint64
	Res      int32
	Flags    uint32
}

type sqringOffsets struct {
	_           structs.HostLayout
	Head        uint32
	Tail        uint32
	RingMask    uint32
	RingEntries uint32
	Flags       uint32
	Dropped     uint32
	Array       uint32
	Resv1       uint32
	Resv2       uint64
}

type cqringOffsets struct {
	_           structs.HostLayout
	Head        uint32
	Tail        uint32
	RingMask    uint32
	RingEntries uint32
	Overflow    uint32
	Cqes        uint32
	Flags       uint32
	Resv1       uint32
	Resv2       uint64
}

// params is struct io_uring_params (120 bytes).
type params struct {
	_            structs.HostLayout
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     uint32
	WQFd         uint32
	Resv         [3]uint32
	SQOff        sqringOffsets
	CQOff        cqringOffsets
}

// geteventsArg is struct io_uring_getevents_arg.
type geteventsArg struct {
	_         structs.HostLayout
	Sigmask   uint64
	SigmaskSz uint32
	Pad       uint32
	Ts        uint64
}

// kernelTimespec is struct __kernel_timespec.
type kernelTimespec struct {
	_    structs.HostLayout
	Sec  int64
	Nsec int64
}

// rsrcRegister is struct io_uring_rsrc_register.
type rsrcRegister struct {
	_     structs.HostLayout
	Nr    uint32
	Flags uint32
	Resv2 uint64
	Data  uint64
	Tags  uint64
}

// rsrcUpdate is struct io_uring_rsrc_update (used for RING_FDS).
type rsrcUpdate struct {
	_      structs.HostLayout
	Offset uint32
	Resv   uint32
	Data   uint64
}

// rsrcUpdate2 is struct io_uring_rsrc_update2 (FILES_UPDATE2,
// BUFFERS_UPDATE: replace nr entries of a table from offset).
type rsrcUpdate2 struct {
	_      structs.HostLayout
	Offset uint32
	Resv   uint32
	Data   uint64
	Tags   uint64
	Nr     uint32
	Resv2  uint32
}

// bufReg is struct io_uring_buf_reg (IORING_REGISTER_PBUF_RING, 5.19).
type bufReg struct {
	_           structs.HostLayout
	RingAddr    uint64
	RingEntries uint32
	Bgid        uint16
	Flags       uint16
	Resv        [3]uint64
}

// bufDesc is struct io_uring_buf, one entry of a provided-buffer ring. The
// ring's tail (u16) overlays entry 0's resv, at byte 14 of the ring.
type bufDesc struct {
	_    structs.HostLayout
	Addr uint64
	Len  uint32
	Bid  uint16
	Resv uint16
}

type probeOp struct {
	_     structs.HostLayout
	Op    uint8
	Resv  uint8
	Flags uint16
	Resv2 uint32
}

// probe is struct io_uring_probe with room for 256 ops.
type probe struct {
	_      structs.HostLayout
	LastOp uint8
	OpsLen uint8
	Resv   uint16
	Resv2  [3]uint32
	Ops    [256]probeOp
}
