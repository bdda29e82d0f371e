package uapi

import (
	"testing"
	"unsafe"
)

// TestUAPILayout pins the Go structs to the C layout of
// include/uapi/linux/ublk_cmd.h (7.3) on LP64.
func TestUAPILayout(t *testing.T) {
	var p Params
	cases := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof ublksrv_ctrl_cmd", unsafe.Sizeof(CtrlCmd{}), 32},
		{"sizeof ublksrv_ctrl_dev_info", unsafe.Sizeof(DevInfo{}), 64},
		{"sizeof ublksrv_io_desc", unsafe.Sizeof(IODesc{}), 24},
		{"sizeof ublksrv_io_cmd", unsafe.Sizeof(IOCmd{}), 16},
		{"sizeof ublk_params", unsafe.Sizeof(p), 152},
		{"sizeof ublk_batch_io", unsafe.Sizeof(BatchIO{}), 16},
		{"batch_io.nr_elem", unsafe.Offsetof(BatchIO{}.NrElem), 4},
		{"batch_io.elem_bytes", unsafe.Offsetof(BatchIO{}.ElemBytes), 6},
		{"sizeof ublk_elem_header", unsafe.Sizeof(BatchElem{}), 8},
		{"elem_header.buf_index", unsafe.Offsetof(BatchElem{}.BufIndex), 2},
		{"elem_header.result", unsafe.Offsetof(BatchElem{}.Result), 4},
		{"sizeof ublk_param_basic", unsafe.Sizeof(ParamBasic{}), 32},
		{"sizeof ublk_param_discard", unsafe.Sizeof(ParamDiscard{}), 20},
		{"sizeof ublk_param_zoned", unsafe.Sizeof(ParamZoned{}), 32},
		{"ctrl_cmd.addr", unsafe.Offsetof(CtrlCmd{}.Addr), 8},
		{"ctrl_cmd.data", unsafe.Offsetof(CtrlCmd{}.Data), 16},
		{"ctrl_cmd.dev_path_len", unsafe.Offsetof(CtrlCmd{}.DevPathLen), 24},
		{"dev_info.max_io_buf_bytes", unsafe.Offsetof(DevInfo{}.MaxIOBufBytes), 8},
		{"dev_info.ublksrv_pid", unsafe.Offsetof(DevInfo{}.UblksrvPID), 16},
		{"dev_info.flags", unsafe.Offsetof(DevInfo{}.Flags), 24},
		{"dev_info.owner_uid", unsafe.Offsetof(DevInfo{}.OwnerUID), 40},
		{"io_desc.start_sector", unsafe.Offsetof(IODesc{}.StartSector), 8},
		{"io_desc.addr", unsafe.Offsetof(IODesc{}.Addr), 16},
		{"io_cmd.result", unsafe.Offsetof(IOCmd{}.Result), 4},
		{"io_cmd.addr", unsafe.Offsetof(IOCmd{}.Addr), 8},
		{"Params.basic", unsafe.Offsetof(p.Basic), 8},
		{"Params.discard", unsafe.Offsetof(p.Discard), 40},
		{"Params.devt", unsafe.Offsetof(p.Devt), 60},
		{"Params.zoned", unsafe.Offsetof(p.Zoned), 76},
		{"Params.dma", unsafe.Offsetof(p.DMA), 108},
		{"Params.seg", unsafe.Offsetof(p.Seg), 120},
		{"Params.integrity", unsafe.Offsetof(p.Integrity), 136},
		{"basic.max_sectors", unsafe.Offsetof(p.Basic.MaxSectors), 8},
		{"basic.dev_sectors", unsafe.Offsetof(p.Basic.DevSectors), 16},
		{"discard.max_discard_segments", unsafe.Offsetof(p.Discard.MaxDiscardSegments), 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %d, want %d", c.got, c.want)
			}
		})
	}
}

// TestCommandEncoding checks the ioctl encoding against the values the
// kernel header's _IOR/_IOWR macros produce.
func TestCommandEncoding(t *testing.T) {
	cases := []struct {
		name      string
		got, want uint32
	}{
		{"GET_QUEUE_AFFINITY", CmdGetQueueAffinity, 0x80207501},
		{"GET_DEV_INFO", CmdGetDevInfo, 0x80207502},
		{"ADD_DEV", CmdAddDev, 0xC0207504},
		{"DEL_DEV", CmdDelDev, 0xC0207505},
		{"START_DEV", CmdStartDev, 0xC0207506},
		{"STOP_DEV", CmdStopDev, 0xC0207507},
		{"SET_PARAMS", CmdSetParams, 0xC0207508},
		{"GET_PARAMS", CmdGetParams, 0x80207509},
		{"START_USER_RECOVERY", CmdStartUserRecovery, 0xC0207510},
		{"END_USER_RECOVERY", CmdEndUserRecovery, 0xC0207511},
		{"GET_DEV_INFO2", CmdGetDevInfo2, 0x80207512},
		{"GET_FEATURES", CmdGetFeatures, 0x80207513},
		{"DEL_DEV_ASYNC", CmdDelDevAsync, 0x80207514},
		{"UPDATE_SIZE", CmdUpdateSize, 0xC0207515},
		{"QUIESCE_DEV", CmdQuiesceDev, 0xC0207516},
		{"TRY_STOP_DEV", CmdTryStopDev, 0xC0207517},
		{"IO_FETCH_REQ", IOFetchReq, 0xC0107520},
		{"IO_COMMIT_AND_FETCH_REQ", IOCommitAndFetchReq, 0xC0107521},
		{"IO_NEED_GET_DATA", IONeedGetData, 0xC0107522},
		{"IO_REGISTER_IO_BUF", IORegisterIOBuf, 0xC0107523},
		{"IO_UNREGISTER_IO_BUF", IOUnregisterIOBuf, 0xC0107524},
		{"IO_PREP_IO_CMDS", IOPrepIOCmds, 0xC0107525},
		{"IO_COMMIT_IO_CMDS", IOCommitIOCmds, 0xC0107526},
		{"IO_FETCH_IO_CMDS", IOFetchIOCmds, 0xC0107527},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %#x, want %#x", c.got, c.want)
			}
		})
	}
}
