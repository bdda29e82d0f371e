package ublk

import "github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"

// The parts of the UAPI (internal/uapi) that are this package's API too:
// device info, states and feature flags, which callers read from Control
// and Server.

// DevInfo is struct ublksrv_ctrl_dev_info (64 bytes).
type DevInfo = uapi.DevInfo

// DevState is ublksrv_ctrl_dev_info.state (UBLK_S_DEV_*).
type DevState = uapi.DevState

// Device states.
const (
	StateDead     = uapi.StateDead
	StateLive     = uapi.StateLive
	StateQuiesced = uapi.StateQuiesced
	StateFailIO   = uapi.StateFailIO
)

// Feature flags (UBLK_F_*): ADD_DEV flags, GET_FEATURES bits.
const (
	FlagSupportZeroCopy     = uapi.FlagSupportZeroCopy
	FlagURingCmdCompInTask  = uapi.FlagURingCmdCompInTask
	FlagNeedGetData         = uapi.FlagNeedGetData
	FlagUserRecovery        = uapi.FlagUserRecovery
	FlagUserRecoveryReissue = uapi.FlagUserRecoveryReissue
	FlagUnprivilegedDev     = uapi.FlagUnprivilegedDev
	FlagCmdIoctlEncode      = uapi.FlagCmdIoctlEncode
	FlagUserCopy            = uapi.FlagUserCopy
	FlagZoned               = uapi.FlagZoned
	FlagUserRecoveryFailIO  = uapi.FlagUserRecoveryFailIO
	FlagUpdateSize          = uapi.FlagUpdateSize
	FlagAutoBufReg          = uapi.FlagAutoBufReg
	FlagQuiesce             = uapi.FlagQuiesce
	FlagPerIODaemon         = uapi.FlagPerIODaemon
	FlagBufRegOffDaemon     = uapi.FlagBufRegOffDaemon
	FlagBatchIO             = uapi.FlagBatchIO
	FlagIntegrity           = uapi.FlagIntegrity
	FlagSafeStopDev         = uapi.FlagSafeStopDev
	FlagNoAutoPartScan      = uapi.FlagNoAutoPartScan
	FlagShmemZC             = uapi.FlagShmemZC
	FlagIODescSize          = uapi.FlagIODescSize
)

// Limits of the UAPI that state records and tuning are checked against.
const (
	maxQueueDepth = uapi.MaxQueueDepth
	maxNrQueues   = uapi.MaxNrQueues
)
