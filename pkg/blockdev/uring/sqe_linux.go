// SQE prep helpers.
//
// Soundness: buffers are passed to the kernel as integer addresses. The
// caller guarantees (doc.go, caller duty 4) that they stay valid until the
// CQE: memory from Buffers lives outside the GC heap; Go memory must be
// pinned. Cmd and SQE128.Cmd return views into the SQE itself.

package uring

import "unsafe"

// addrOf returns the address of b's first byte, 0 for an empty slice.
func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// PrepRW fills the common fields of a read/write-like SQE.
func (s *SQE) PrepRW(op uint8, fd int32, addr uint64, length uint32, off uint64) {
	s.Opcode = op
	s.Fd = fd
	s.Addr = addr
	s.Len = length
	s.Off = off
}

// PrepNop prepares a no-op.
func (s *SQE) PrepNop() { s.Opcode = IORING_OP_NOP }

// PrepRead prepares a read of len(buf) bytes at off into buf.
func (s *SQE) PrepRead(fd int32, buf []byte, off uint64) {
	s.PrepRW(IORING_OP_READ, fd, addrOf(buf), uint32(len(buf)), off)
}

// PrepWrite prepares a write of buf at off. Set OpFlags = unix.RWF_DSYNC
// for a FUA write.
func (s *SQE) PrepWrite(fd int32, buf []byte, off uint64) {
	s.PrepRW(IORING_OP_WRITE, fd, addrOf(buf), uint32(len(buf)), off)
}

// PrepReadFixed prepares a read into buf, which lies inside registered
// buffer bufIndex.
func (s *SQE) PrepReadFixed(fd int32, buf []byte, off uint64, bufIndex uint16) {
	s.PrepRW(IORING_OP_READ_FIXED, fd, addrOf(buf), uint32(len(buf)), off)
	s.BufIndex = bufIndex
}

// PrepWriteFixed prepares a write from buf, inside registered buffer
// bufIndex.
func (s *SQE) PrepWriteFixed(fd int32, buf []byte, off uint64, bufIndex uint16) {
	s.PrepRW(IORING_OP_WRITE_FIXED, fd, addrOf(buf), uint32(len(buf)), off)
	s.BufIndex = bufIndex
}

// PrepFsync prepares an fsync; flags IORING_FSYNC_DATASYNC makes it an
// fdatasync.
func (s *SQE) PrepFsync(fd int32, flags uint32) {
	s.Opcode = IORING_OP_FSYNC
	s.Fd = fd
	s.OpFlags = flags
}

// PrepFallocate prepares fallocate(fd, mode, off, length). The UAPI carries
// length in addr and mode in len.
func (s *SQE) PrepFallocate(fd int32, mode uint32, off, length uint64) {
	s.PrepRW(IORING_OP_FALLOCATE, fd, length, mode, off)
}

// PrepPollAdd prepares a one-shot poll for events (unix.POLLIN ...).
func (s *SQE) PrepPollAdd(fd int32, events uint32) {
	s.Opcode = IORING_OP_POLL_ADD
	s.Fd = fd
	s.OpFlags = events
}

// PrepURingCmd prepares an IORING_OP_URING_CMD with cmdOp in the low 32 bits
// of the offset field; fill the payload through Cmd (or SQE128.Cmd).
func (s *SQE) PrepURingCmd(fd int32, cmdOp uint32) {
	s.Opcode = IORING_OP_URING_CMD
	s.Fd = fd
	s.Off = uint64(cmdOp)
}

// CmdOp returns the URING_CMD cmd_op (the low 32 bits of Off).
func (s *SQE) CmdOp() uint32 { return uint32(s.Off) }

// Cmd returns the 16-byte command area at offset 48 of a 64-byte SQE.
func (s *SQE) Cmd() *[16]byte { return (*[16]byte)(unsafe.Pointer(&s.Addr3)) }

// Cmd returns the 80-byte command area of an SQE128 entry (offset 48).
func (s *SQE128) Cmd() *[80]byte { return (*[80]byte)(unsafe.Pointer(&s.SQE.Addr3)) }
