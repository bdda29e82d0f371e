package dataplane

import (
	"math"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// The pure core of the queue: descriptor decoding, the mapping of a ublk
// request onto one backing-file operation, and the user_data encoding. No
// I/O happens here; queue_linux.go drives it.

// request is one decoded ublksrv_io_desc, in bytes rather than sectors.
type request struct {
	op    uint8
	flags uint32 // op_flags >> 8 << 8 (the UBLK_IO_F_* bits)
	off   int64  // start_sector << 9
	len   uint32 // nr_sectors << 9
	// outOfRange marks a descriptor whose bytes do not fit off and len:
	// an end beyond int64, a byte count beyond len's 32 bits, or, for
	// READ and WRITE, more bytes than the int32 result that commits
	// them can count. planFor fails it.
	outOfRange bool
}

// Largest descriptor fields that fit a request. DISCARD and WRITE_ZEROES
// commit 0, so only len bounds them: MaxZeroSectors is also what the
// device advertises for both, as the loop driver does (UINT_MAX >> 9). READ
// and WRITE commit their byte count as an int32, which bounds them lower;
// the kernel keeps them within max_io_buf_bytes anyway.
const (
	MaxZeroSectors = math.MaxUint32 >> 9
	maxXferSectors = math.MaxInt32 >> 9
	maxEndSector   = math.MaxInt64 >> 9
)

// decodeDesc turns the raw fields of a ublksrv_io_desc into a request.
// Sectors are always 512 bytes, whatever the device's logical block size.
func decodeDesc(opFlags, nrSectors uint32, startSector uint64) request {
	op := uint8(opFlags & 0xff)
	limit := uint32(MaxZeroSectors)
	if op == uapi.IOOpRead || op == uapi.IOOpWrite {
		limit = maxXferSectors
	}
	return request{
		op:         op,
		flags:      opFlags &^ 0xff,
		off:        int64(startSector << 9),
		len:        nrSectors << 9,
		outOfRange: nrSectors > limit || startSector > maxEndSector-uint64(nrSectors),
	}
}

// action is what the queue does with a request.
type action uint8

const (
	actFail      action = iota // commit -errno at once (unsupported op)
	actRead                    // read the backing file into the buffer
	actWrite                   // write the buffer to the backing file
	actFsync                   // fdatasync the backing file
	actFallocate               // punch a hole or zero a range
	actComplete                // commit the full byte count at once (null target)
)

// plan is the single backing operation that serves a request.
type plan struct {
	act     action
	rwFlags uint32 // RWF_DSYNC for FUA writes
	mode    uint32 // fallocate mode
	errno   int32  // negative errno for actFail
}

// planFor maps a request onto the backing-file operation for a target kind:
//
//	READ          → read at off, len
//	WRITE         → write at off, len; FUA adds RWF_DSYNC
//	FLUSH         → fsync with IORING_FSYNC_DATASYNC (fdatasync)
//	DISCARD       → fallocate PUNCH_HOLE|KEEP_SIZE
//	WRITE_ZEROES  → fallocate ZERO_RANGE|KEEP_SIZE with NOUNMAP or
//	                Target.KeepAllocated, PUNCH_HOLE|KEEP_SIZE otherwise
//	                (as the loop driver does)
//	anything else → -EOPNOTSUPP
//
// A descriptor out of range (see request) fails with -EINVAL; the kernel
// sends none, but a wrapped length or offset must not reach the file. The
// null target completes every supported op at once; the fail target fails
// every request with -EIO.
func planFor(r request, t Target) plan {
	var p plan
	if t.Kind == TargetFail {
		return plan{act: actFail, errno: -int32(unix.EIO)}
	}
	if r.outOfRange && r.op != uapi.IOOpFlush {
		return plan{act: actFail, errno: -int32(unix.EINVAL)}
	}
	switch r.op {
	case uapi.IOOpRead:
		p.act = actRead
	case uapi.IOOpWrite:
		p.act = actWrite
		if r.flags&uapi.IOFlagFUA != 0 {
			p.rwFlags = unix.RWF_DSYNC
		}
	case uapi.IOOpFlush:
		p.act = actFsync
	case uapi.IOOpDiscard:
		p.act, p.mode = actFallocate, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE
	case uapi.IOOpWriteZeroes:
		p.act, p.mode = actFallocate, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE
		if r.flags&uapi.IOFlagNoUnmap != 0 || t.KeepAllocated {
			p.mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
		}
	default:
		return plan{act: actFail, errno: -int32(unix.EOPNOTSUPP)}
	}
	if t.Kind == TargetNull {
		p.act = actComplete
	}
	return p
}

// fullResult is what a fully served request commits: the byte count for
// READ and WRITE (a short count makes the kernel requeue the rest), 0 for
// FLUSH, DISCARD and WRITE_ZEROES.
func fullResult(r request) int32 {
	if r.op == uapi.IOOpRead || r.op == uapi.IOOpWrite {
		return int32(r.len)
	}
	return 0
}

// user_data of every SQE a server thread submits: the tag in bits 0–15, the
// queue's slot on its thread in bits 16–31 and the kind of operation in
// bits 32–39. Integers only, never a Go pointer.
const (
	udCmd     = 1 // FETCH_REQ or COMMIT_AND_FETCH_REQ for the tag
	udBacking = 2 // backing-file operation for the tag
	udWake    = 3 // poll on the thread's eventfd (slot and tag unused)
	udRegBuf  = 4 // zero copy: REGISTER_IO_BUF/UNREGISTER_IO_BUF for the tag
	udFetch   = 5 // batch mode: the multishot FETCH_IO_CMDS (tag unused)
	udBatch   = 6 // batch mode: PREP_IO_CMDS or COMMIT_IO_CMDS (tag: element array)
	udCopy    = 7 // USER_COPY: a read or write of the request's data on /dev/ublkcN
)

func encodeUD(kind uint8, slot, tag uint16) uint64 {
	return uint64(kind)<<32 | uint64(slot)<<16 | uint64(tag)
}

func decodeUD(ud uint64) (kind uint8, slot, tag uint16) {
	return uint8(ud >> 32), uint16(ud >> 16), uint16(ud)
}

// userCopyPos is the /dev/ublkcN offset of byte off of the data of queue
// qid's request on tag, for USER_COPY reads and writes (UBLKSRV_IO_BUF_OFFSET
// + qid << UBLK_QID_OFF + tag << UBLK_TAG_OFF + off).
func userCopyPos(qid, tag uint16, off uint32) int64 {
	return uapi.IOBufOffset + int64(qid)<<uapi.QIDOff + int64(tag)<<uapi.TagOff + int64(off)
}
