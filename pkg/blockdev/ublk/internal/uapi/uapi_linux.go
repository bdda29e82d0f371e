// Package uapi is the ublk driver's user-space ABI, written by hand from
// the kernel's include/uapi/linux/ublk_cmd.h as shipped by Debian's
// linux-libc-dev 7.3.4-1~bpo13+1 (trixie-backports): the control commands
// and their payloads that package ublk sends, and the I/O commands,
// descriptors and batch elements its data plane (package dataplane) uses.
// Layouts are x86-64/arm64 (LP64, little-endian); uapi_linux_test.go pins
// every size and offset to the C values. Only ioctl-encoded command values
// are defined: csi-fastblk needs kernel 6.5 or later (see ublk's
// features_linux.go).
//
// This package imports unsafe only to compute command sizes for the ioctl
// encoding; nothing here touches memory.
package uapi

import (
	"structs"
	"unsafe"
)

// ioctl encoding, as include/uapi/asm-generic/ioctl.h.
const (
	iocWrite = 1
	iocRead  = 2
	iocType  = 'u'
)

func ioc(dir, nr, size uintptr) uint32 {
	return uint32(dir<<30 | size<<16 | iocType<<8 | nr)
}

func ior(nr, size uintptr) uint32  { return ioc(iocRead, nr, size) }
func iowr(nr, size uintptr) uint32 { return ioc(iocRead|iocWrite, nr, size) }

const (
	SizeofCtrlCmd = unsafe.Sizeof(CtrlCmd{})
	SizeofIOCmd   = unsafe.Sizeof(IOCmd{})
	SizeofBatchIO = unsafe.Sizeof(BatchIO{})
)

// Control commands (UBLK_U_CMD_*), sent on /dev/ublk-control.
var (
	CmdGetQueueAffinity  = ior(0x01, SizeofCtrlCmd)
	CmdGetDevInfo        = ior(0x02, SizeofCtrlCmd)
	CmdAddDev            = iowr(0x04, SizeofCtrlCmd)
	CmdDelDev            = iowr(0x05, SizeofCtrlCmd)
	CmdStartDev          = iowr(0x06, SizeofCtrlCmd)
	CmdStopDev           = iowr(0x07, SizeofCtrlCmd)
	CmdSetParams         = iowr(0x08, SizeofCtrlCmd)
	CmdGetParams         = ior(0x09, SizeofCtrlCmd)
	CmdStartUserRecovery = iowr(0x10, SizeofCtrlCmd)
	CmdEndUserRecovery   = iowr(0x11, SizeofCtrlCmd)
	CmdGetDevInfo2       = ior(0x12, SizeofCtrlCmd)
	CmdGetFeatures       = ior(0x13, SizeofCtrlCmd)
	CmdDelDevAsync       = ior(0x14, SizeofCtrlCmd) // _IOR in the header, not _IOWR
	CmdUpdateSize        = iowr(0x15, SizeofCtrlCmd)
	CmdQuiesceDev        = iowr(0x16, SizeofCtrlCmd)
	CmdTryStopDev        = iowr(0x17, SizeofCtrlCmd)
)

// IO commands (UBLK_U_IO_*), sent on /dev/ublkcN from the queue's thread.
var (
	IOFetchReq          = iowr(0x20, SizeofIOCmd)
	IOCommitAndFetchReq = iowr(0x21, SizeofIOCmd)
	IONeedGetData       = iowr(0x22, SizeofIOCmd)
	IORegisterIOBuf     = iowr(0x23, SizeofIOCmd)
	IOUnregisterIOBuf   = iowr(0x24, SizeofIOCmd)
	// Batch I/O (UBLK_F_BATCH_IO, 7.0): the payload is struct
	// ublk_batch_io, which has the size of ublksrv_io_cmd.
	IOPrepIOCmds   = iowr(0x25, SizeofBatchIO)
	IOCommitIOCmds = iowr(0x26, SizeofBatchIO)
	IOFetchIOCmds  = iowr(0x27, SizeofBatchIO)
)

// BatchIO is struct ublk_batch_io, in the SQE's cmd area of a batch
// command: PREP and COMMIT carry nr_elem elements of elem_bytes each at
// sqe->addr; FETCH (multishot) has the kernel write u16 tags into the
// provided buffer it selects.
type BatchIO struct {
	_         structs.HostLayout
	QID       uint16
	Flags     uint16
	NrElem    uint16
	ElemBytes uint8
	Reserved  uint8
	Reserved2 uint64
}

// BatchElem is struct ublk_elem_header, the head of each PREP/COMMIT
// element; with BatchHasBufAddr a u64 buffer address follows it.
type BatchElem struct {
	_        structs.HostLayout
	Tag      uint16
	BufIndex uint16 // AUTO_BUF_REG: the fixed-buffer slot of the tag's next request
	Result   int32
}

// ublk_batch_io.flags.
const BatchHasBufAddr = 1 << 1 // UBLK_BATCH_F_HAS_BUF_ADDR: copy mode's buffer follows each header

// FeaturesLen is UBLK_FEATURES_LEN: GET_FEATURES wants exactly 8 bytes.
const FeaturesLen = 8

// Results of FETCH_REQ / COMMIT_AND_FETCH_REQ completions.
const (
	IOResOK          = 0
	IOResNeedGetData = 1
	IOResAbort       = -19 // -ENODEV: the device is stopping; do not re-fetch
)

// Descriptor area and USER_COPY addressing.
const (
	CmdBufOffset   = 0          // UBLKSRV_CMD_BUF_OFFSET
	IOBufOffset    = 0x80000000 // UBLKSRV_IO_BUF_OFFSET
	MaxQueueDepth  = 4096       // UBLK_MAX_QUEUE_DEPTH
	IOBufBits      = 25         // UBLK_IO_BUF_BITS
	TagOff         = IOBufBits  // UBLK_TAG_OFF
	TagBits        = 16         // UBLK_TAG_BITS
	QIDOff         = TagOff + TagBits
	QIDBits        = 12 // UBLK_QID_BITS
	MaxNrQueues    = 1 << QIDBits
	SizeofIODesc   = 24
	IODescStridePg = MaxQueueDepth * SizeofIODesc // rounded up to the page size per queue
)

// Feature flags (UBLK_F_*): ADD_DEV flags, GET_FEATURES bits.
const (
	FlagSupportZeroCopy     uint64 = 1 << 0
	FlagURingCmdCompInTask  uint64 = 1 << 1
	FlagNeedGetData         uint64 = 1 << 2
	FlagUserRecovery        uint64 = 1 << 3
	FlagUserRecoveryReissue uint64 = 1 << 4
	FlagUnprivilegedDev     uint64 = 1 << 5
	FlagCmdIoctlEncode      uint64 = 1 << 6
	FlagUserCopy            uint64 = 1 << 7
	FlagZoned               uint64 = 1 << 8
	FlagUserRecoveryFailIO  uint64 = 1 << 9
	FlagUpdateSize          uint64 = 1 << 10
	FlagAutoBufReg          uint64 = 1 << 11
	FlagQuiesce             uint64 = 1 << 12
	FlagPerIODaemon         uint64 = 1 << 13
	FlagBufRegOffDaemon     uint64 = 1 << 14
	FlagBatchIO             uint64 = 1 << 15
	FlagIntegrity           uint64 = 1 << 16
	FlagSafeStopDev         uint64 = 1 << 17
	FlagNoAutoPartScan      uint64 = 1 << 18
	FlagShmemZC             uint64 = 1 << 19
	FlagIODescSize          uint64 = 1 << 20
)

// DevState is ublksrv_ctrl_dev_info.state (UBLK_S_DEV_*).
type DevState uint16

// Device states.
const (
	StateDead     DevState = 0
	StateLive     DevState = 1
	StateQuiesced DevState = 2
	StateFailIO   DevState = 3
)

// IO op codes (op_flags & 0xff) and flags (op_flags bits 8..31).
const (
	IOOpRead        = 0
	IOOpWrite       = 1
	IOOpFlush       = 2
	IOOpDiscard     = 3
	IOOpWriteSame   = 4
	IOOpWriteZeroes = 5

	IOFlagFUA     = 1 << 13
	IOFlagNoUnmap = 1 << 15
)

// Basic parameter attributes (UBLK_ATTR_*).
const (
	AttrReadOnly      = 1 << 0
	AttrRotational    = 1 << 1
	AttrVolatileCache = 1 << 2
	AttrFUA           = 1 << 3
)

// Parameter types (UBLK_PARAM_TYPE_*).
const (
	ParamTypeBasic     = 1 << 0
	ParamTypeDiscard   = 1 << 1
	ParamTypeDevt      = 1 << 2
	ParamTypeZoned     = 1 << 3
	ParamTypeDMAAlign  = 1 << 4
	ParamTypeSegment   = 1 << 5
	ParamTypeIntegrity = 1 << 6
)

// CtrlCmd is struct ublksrv_ctrl_cmd (32 bytes), in the SQE128 cmd area.
type CtrlCmd struct {
	_          structs.HostLayout
	DevID      uint32
	QueueID    uint16
	Len        uint16
	Addr       uint64
	Data       uint64
	DevPathLen uint16
	Pad        uint16
	Reserved   uint32
}

// DevInfo is struct ublksrv_ctrl_dev_info (64 bytes).
type DevInfo struct {
	_             structs.HostLayout
	NrHWQueues    uint16
	QueueDepth    uint16
	State         DevState
	IODescSize    uint16 // pad0 before UBLK_F_IO_DESC_SIZE
	MaxIOBufBytes uint32
	DevID         uint32
	UblksrvPID    int32
	Pad1          uint32
	Flags         uint64
	UblksrvFlags  uint64 // private to the server; the kernel keeps it
	OwnerUID      uint32
	OwnerGID      uint32
	Reserved1     uint64
	Reserved2     uint64
}

// IODesc is struct ublksrv_io_desc (24 bytes), one per tag in the mmapped
// descriptor area of each queue.
type IODesc struct {
	_           structs.HostLayout
	OpFlags     uint32
	NrSectors   uint32
	StartSector uint64
	Addr        uint64
}

// IOCmd is struct ublksrv_io_cmd (16 bytes), in the SQE64 cmd area.
type IOCmd struct {
	_      structs.HostLayout
	QID    uint16
	Tag    uint16
	Result int32
	Addr   uint64
}

type ParamBasic struct {
	_                structs.HostLayout
	Attrs            uint32
	LogicalBSShift   uint8
	PhysicalBSShift  uint8
	IOOptShift       uint8
	IOMinShift       uint8
	MaxSectors       uint32
	ChunkSectors     uint32
	DevSectors       uint64
	VirtBoundaryMask uint64
}

type ParamDiscard struct {
	_                     structs.HostLayout
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	Reserved0             uint16
}

type ParamDevt struct {
	_         structs.HostLayout
	CharMajor uint32
	CharMinor uint32
	DiskMajor uint32
	DiskMinor uint32
}

type ParamZoned struct {
	_                    structs.HostLayout
	MaxOpenZones         uint32
	MaxActiveZones       uint32
	MaxZoneAppendSectors uint32
	Reserved             [20]uint8
}

type ParamDMAAlign struct {
	_         structs.HostLayout
	Alignment uint32
	Pad       [4]uint8
}

type ParamSegment struct {
	_               structs.HostLayout
	SegBoundaryMask uint64
	MaxSegmentSize  uint32
	MaxSegments     uint16
	Pad             [2]uint8
}

type ParamIntegrity struct {
	_                    structs.HostLayout
	Flags                uint32
	MaxIntegritySegments uint16
	IntervalExp          uint8
	MetadataSize         uint8
	PIOffset             uint8
	CsumType             uint8
	TagSize              uint8
	Pad                  [5]uint8
}

// Params is struct ublk_params (152 bytes in the 7.3 header). Kernels with a
// smaller struct truncate len to their own size, so sending all of it works
// on every supported kernel as long as types only names what they know.
type Params struct {
	_         structs.HostLayout
	Len       uint32
	Types     uint32
	Basic     ParamBasic
	Discard   ParamDiscard
	Devt      ParamDevt
	Zoned     ParamZoned
	DMA       ParamDMAAlign
	Seg       ParamSegment
	Integrity ParamIntegrity
}

// SizeofParams is sizeof(struct ublk_params) in the header used here.
const SizeofParams = uint32(unsafe.Sizeof(Params{}))
