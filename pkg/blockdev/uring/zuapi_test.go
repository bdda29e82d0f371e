package uring

import (
	"testing"
	"unsafe"
)

// Values from include/uapi/linux/io_uring.h (x86-64/arm64, LP64).
func TestUAPILayout(t *testing.T) {
	var sqe SQE
	var cqe CQE
	var p params
	var sq sqringOffsets
	var cq cqringOffsets
	cases := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof io_uring_sqe", unsafe.Sizeof(sqe), 64},
		{"sizeof sqe128", unsafe.Sizeof(SQE128{}), 128},
		{"sqe.opcode", unsafe.Offsetof(sqe.Opcode), 0},
		{"sqe.flags", unsafe.Offsetof(sqe.Flags), 1},
		{"sqe.ioprio", unsafe.Offsetof(sqe.Ioprio), 2},
		{"sqe.fd", unsafe.Offsetof(sqe.Fd), 4},
		{"sqe.off", unsafe.Offsetof(sqe.Off), 8},
		{"sqe.addr", unsafe.Offsetof(sqe.Addr), 16},
		{"sqe.len", unsafe.Offsetof(sqe.Len), 24},
		{"sqe.rw_flags", unsafe.Offsetof(sqe.OpFlags), 28},
		{"sqe.user_data", unsafe.Offsetof(sqe.UserData), 32},
		{"sqe.buf_index", unsafe.Offsetof(sqe.BufIndex), 40},
		{"sqe.personality", unsafe.Offsetof(sqe.Personality), 42},
		{"sqe.file_index", unsafe.Offsetof(sqe.FileIndex), 44},
		{"sqe.addr3 (cmd)", unsafe.Offsetof(sqe.Addr3), 48},
		{"sizeof io_uring_cqe", unsafe.Sizeof(cqe), 16},
		{"cqe.res", unsafe.Offsetof(cqe.Res), 8},
		{"cqe.flags", unsafe.Offsetof(cqe.Flags), 12},
		{"sizeof io_uring_params", unsafe.Sizeof(p), 120},
		{"params.features", unsafe.Offsetof(p.Features), 20},
		{"params.sq_off", unsafe.Offsetof(p.SQOff), 40},
		{"params.cq_off", unsafe.Offsetof(p.CQOff), 80},
		{"sizeof io_sqring_offsets", unsafe.Sizeof(sq), 40},
		{"sq_off.array", unsafe.Offsetof(sq.Array), 24},
		{"sizeof io_cqring_offsets", unsafe.Sizeof(cq), 40},
		{"cq_off.cqes", unsafe.Offsetof(cq.Cqes), 20},
		{"cq_off.flags", unsafe.Offsetof(cq.Flags), 24},
		{"sizeof io_uring_getevents_arg", unsafe.Sizeof(geteventsArg{}), 24},
		{"sizeof io_uring_rsrc_register", unsafe.Sizeof(rsrcRegister{}), 32},
		{"sizeof io_uring_rsrc_update", unsafe.Sizeof(rsrcUpdate{}), 16},
		{"sizeof io_uring_rsrc_update2", unsafe.Sizeof(rsrcUpdate2{}), 32},
		{"rsrc_update2.data", unsafe.Offsetof(rsrcUpdate2{}.Data), 8},
		{"rsrc_update2.nr", unsafe.Offsetof(rsrcUpdate2{}.Nr), 24},
		{"sizeof io_uring_buf_reg", unsafe.Sizeof(bufReg{}), 40},
		{"buf_reg.bgid", unsafe.Offsetof(bufReg{}.Bgid), 12},
		{"sizeof io_uring_buf", unsafe.Sizeof(bufDesc{}), 16},
		{"buf.bid", unsafe.Offsetof(bufDesc{}.Bid), 12},
		{"buf_ring.tail (buf[0].resv)", unsafe.Offsetof(bufDesc{}.Resv), 14},
		{"sizeof io_uring_probe_op", unsafe.Sizeof(probeOp{}), 8},
		{"probe.ops", unsafe.Offsetof(probe{}.Ops), 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Errorf("got %d, want %d", c.got, c.want)
			}
		})
	}
}

func TestURingCmdEncoding(t *testing.T) {
	var e SQE128
	e.SQE.PrepURingCmd(7, 0xc0207504)
	e.Cmd()[0] = 0xaa
	e.Cmd()[79] = 0xbb
	raw := (*[128]byte)(unsafe.Pointer(&e))
	if raw[0] != IORING_OP_URING_CMD {
		t.Errorf("opcode byte %d", raw[0])
	}
	if got := *(*uint32)(unsafe.Pointer(&raw[8])); got != 0xc0207504 {
		t.Errorf("cmd_op at offset 8 = %#x", got)
	}
	if got := *(*uint32)(unsafe.Pointer(&raw[12])); got != 0 {
		t.Errorf("__pad1 at offset 12 = %#x", got)
	}
	if raw[48] != 0xaa || raw[127] != 0xbb {
		t.Errorf("cmd area not at 48..127: %#x %#x", raw[48], raw[127])
	}
	var s SQE
	s.Cmd()[15] = 1
	if s.Pad2 != 1<<56 {
		t.Errorf("16-byte cmd area does not end at offset 64")
	}
}
