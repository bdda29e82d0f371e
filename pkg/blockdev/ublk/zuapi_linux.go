// UAPI of the ublk driver, written by hand from the kernel's
// include/uapi/linux/ublk_cmd.h as shipped by Debian's linux-libc-dev
// 7.3.4-1~bpo13+1 (trixie-backports). Layouts are x86-64/arm64 (LP64,
// little-endian); zuapi_linux_test.go pins every size and offset to the C
// values. Only ioctl-encoded command values are defined: csi-fastblk needs
// kernel 6.5 or later (see features_linux.go).
//
// This file imports unsafe only to compute command sizes for the ioctl
// encoding; nothing here touches memory.

package ublk

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
	sizeofCtrlCmd = unsafe.Sizeof(ctrlCmd{})
	sizeofIOCmd   = unsafe.Sizeof(ioCmd{})
	sizeofBatchIO = unsafe.Sizeof(batchIO{})
)

// Control commands (UBLK_U_CMD_*), sent on /dev/ublk-control.
var (
	cmdGetQueueAffinity  = ior(0x01, sizeofCtrlCmd)
	cmdGetDevInfo        = ior(0x02, sizeofCtrlCmd)
	cmdAddDev            = iowr(0x04, sizeofCtrlCmd)
	cmdDelDev            = iowr(0x05, sizeofCtrlCmd)
	cmdStartDev          = iowr(0x06, sizeofCtrlCmd)
	cmdStopDev           = iowr(0x07, sizeofCtrlCmd)
	cmdSetParams         = iowr(0x08, sizeofCtrlCmd)
	cmdGetParams         = ior(0x09, sizeofCtrlCmd)
	cmdStartUserRecovery = iowr(0x10, sizeofCtrlCmd)
	cmdEndUserRecovery   = iowr(0x11, sizeofCtrlCmd)
	cmdGetDevInfo2       = ior(0x12, sizeofCtrlCmd)
	cmdGetFeatures       = ior(0x13, sizeofCtrlCmd)
	cmdDelDevAsync       = ior(0x14, sizeofCtrlCmd) // _IOR in the header, not _IOWR
	cmdUpdateSize        = iowr(0x15, sizeofCtrlCmd)
	cmdQuiesceDev        = iowr(0x16, sizeofCtrlCmd)
	cmdTryStopDev        = iowr(0x17, sizeofCtrlCmd)
)

// IO commands (UBLK_U_IO_*), sent on /dev/ublkcN from the queue's thread.
var (
	ioFetchReq          = iowr(0x20, sizeofIOCmd)
	ioCommitAndFetchReq = iowr(0x21, sizeofIOCmd)
	ioNeedGetData       = iowr(0x22, sizeofIOCmd)
	ioRegisterIOBuf     = iowr(0x23, sizeofIOCmd)
	ioUnregisterIOBuf   = iowr(0x24, sizeofIOCmd)
	// Batch I/O (UBLK_F_BATCH_IO, 7.0): the payload is struct
	// ublk_batch_io, which has the size of ublksrv_io_cmd.
	ioPrepIOCmds   = iowr(0x25, sizeofBatchIO)
	ioCommitIOCmds = iowr(0x26, sizeofBatchIO)
	ioFetchIOCmds  = iowr(0x27, sizeofBatchIO)
)

// batchIO is struct ublk_batch_io, in the SQE's cmd area of a batch
// command: PREP and COMMIT carry nr_elem elements of elem_bytes each at
// sqe->addr; FETCH (multishot) has the kernel write u16 tags into the
// provided buffer it selects.
type batchIO struct {
	_         structs.HostLayout
	QID       uint16
	Flags     uint16
	NrElem    uint16
	ElemBytes uint8
	Reserved  uint8
	Reserved2 uint64
}

// batchElem is struct ublk_elem_header, the head of each PREP/COMMIT
// element; with batchHasBufAddr a u64 buffer address follows it.
type batchElem struct {
	_        structs.HostLayout
	Tag      uint16
	BufIndex uint16 // AUTO_BUF_REG: the fixed-buffer slot of the tag's next request
	Result   int32
}

// ublk_batch_io.flags.
const batchHasBufAddr = 1 << 1 // UBLK_BATCH_F_HAS_BUF_ADDR: copy mode's buffer follows each header

// featuresLen is UBLK_FEATURES_LEN: GET_FEATURES wants exactly 8 bytes.
const featuresLen = 8

// Results of FETCH_REQ / COMMIT_AND_FETCH_REQ completions.
const (
	ioResOK          = 0
	ioResNeedGetData = 1
	ioResAbort       = -19 // -ENODEV: the device is stopping; do not re-fetch
)

// Descriptor area and USER_COPY addressing.
const (
	cmdBufOffset   = 0          // UBLKSRV_CMD_BUF_OFFSET
	ioBufOffset    = 0x80000000 // UBLKSRV_IO_BUF_OFFSET
	maxQueueDepth  = 4096       // UBLK_MAX_QUEUE_DEPTH
	ioBufBits      = 25         // UBLK_IO_BUF_BITS
	tagOff         = ioBufBits  // UBLK_TAG_OFF
	tagBits        = 16         // UBLK_TAG_BITS
	qidOff         = tagOff + tagBits
	qidBits        = 12 // UBLK_QID_BITS
	maxNrQueues    = 1 << qidBits
	sizeofIODesc   = 24
	ioDescStridePg = maxQueueDepth * sizeofIODesc // rounded up to the page size per queue
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
	ioOpRead        = 0
	ioOpWrite       = 1
	ioOpFlush       = 2
	ioOpDiscard     = 3
	ioOpWriteSame   = 4
	ioOpWriteZeroes = 5

	ioFlagFUA     = 1 << 13
	ioFlagNoUnmap = 1 << 15
)

// Basic parameter attributes (UBLK_ATTR_*).
const (
	attrReadOnly      = 1 << 0
	attrRotational    = 1 << 1
	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

// Parameter types (UBLK_PARAM_TYPE_*).
const (
	paramTypeBasic     = 1 << 0
	paramTypeDiscard   = 1 << 1
	paramTypeDevt      = 1 << 2
	paramTypeZoned     = 1 << 3
	paramTypeDMAAlign  = 1 << 4
	paramTypeSegment   = 1 << 5
	paramTypeIntegrity = 1 << 6
)

// ctrlCmd is struct ublksrv_ctrl_cmd (32 bytes), in the SQE128 cmd area.
type ctrlCmd struct {
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

// ioDesc is struct ublksrv_io_desc (24 bytes), one per tag in the mmapped
// descriptor area of each queue.
type ioDesc struct {
	_           structs.HostLayout
	OpFlags     uint32
	NrSectors   uint32
	StartSector uint64
	Addr        uint64
}

// ioCmd is struct ublksrv_io_cmd (16 bytes), in the SQE64 cmd area.
type ioCmd struct {
	_      structs.HostLayout
	QID    uint16
	Tag    uint16
	Result int32
	Addr   uint64
}

type paramBasic struct {
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

type paramDiscard struct {
	_                     structs.HostLayout
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	Reserved0             uint16
}

type paramDevt struct {
	_         structs.HostLayout
	CharMajor uint32
	CharMinor uint32
	DiskMajor uint32
	DiskMinor uint32
}

type paramZoned struct {
	_                    structs.HostLayout
	MaxOpenZones         uint32
	MaxActiveZones       uint32
	MaxZoneAppendSectors uint32
	Reserved             [20]uint8
}

type paramDMAAlign struct {
	_         structs.HostLayout
	Alignment uint32
	Pad       [4]uint8
}

type paramSegment struct {
	_               structs.HostLayout
	SegBoundaryMask uint64
	MaxSegmentSize  uint32
	MaxSegments     uint16
	Pad             [2]uint8
}

type paramIntegrity struct {
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

// params is struct ublk_params (152 bytes in the 7.3 header). Kernels with a
// smaller struct truncate len to their own size, so sending all of it works
// on every supported kernel as long as types only names what they know.
type params struct {
	_         structs.HostLayout
	Len       uint32
	Types     uint32
	Basic     paramBasic
	Discard   paramDiscard
	Devt      paramDevt
	Zoned     paramZoned
	DMA       paramDMAAlign
	Seg       paramSegment
	Integrity paramIntegrity
}

// sizeofParams is sizeof(struct ublk_params) in the header used here.
const sizeofParams = uint32(unsafe.Sizeof(params{}))
