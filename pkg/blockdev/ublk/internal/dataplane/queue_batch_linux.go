// Batch mode (UBLK_F_BATCH_IO, Linux 7.0+): the queue takes requests and
// gives results back in batches instead of one uring_cmd per tag.
//
// At start one PREP_IO_CMDS arms every tag, and one multishot
// FETCH_IO_CMDS stays armed: for each batch of requests the kernel writes
// their tags (u16) into a buffer of the queue's provided-buffer ring and
// posts one CQE naming it. Results go back as elements (tag, fixed-buffer
// slot, result, and in copy mode the tag's buffer address) gathered over a
// round and sent in one COMMIT_IO_CMDS, which completes the requests and
// re-arms their tags. Per request that saves a COMMIT_AND_FETCH issue and
// its completion, and per batch of dispatched requests the kernel posts one
// CQE instead of one per tag.
//
// The kernel reads a PREP's or COMMIT's elements while it issues the
// command (it never defers them), but a slot is only refilled after its
// CQE, so nothing depends on that. The fetch ring holds one buffer per tag:
// a tag is delivered again only after its commit, and the queue recycles a
// buffer as soon as it has read it, so the ring never runs dry; should the
// FETCH end anyway (-ENOBUFS: the CQ ring was full), it is armed again.
//
// Servers use it only when asked (ServerConfig.BatchIO): in the emulated
// VM it was no faster than one command per request (figures in
// docs/benchmark-studies.md, "Figures behind code comments"), while
// costing the kernel's newest ublk code path.

package dataplane

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// commitSlots is how many element arrays a batch-mode queue has: one being
// filled while the COMMITs sent from the others wait for their CQEs (which
// come at the next reap).
const commitSlots = 4

// maxTagsPerFetch is the most tags the kernel writes for one FETCH CQE
// (256 bytes of u16 tags); a larger buffer would be wasted.
const maxTagsPerFetch = 128

// batch is a batch-mode queue's state; only the server thread touches it.
type batch struct {
	fetch     *uring.BufRing // where the kernel writes the tags of new requests
	elems     *uring.Buffers // commitSlots arrays of depth elements
	elemBytes int
	flags     uint16 // ublk_batch_io.flags of PREP and COMMIT
	slot, n   int    // the array being filled, and its element count
	// want is the CQE result each array's outstanding command should
	// have; -1 when none is outstanding.
	want     [commitSlots]int32
	fetching bool // a FETCH is armed
	ended    bool // the FETCH ended with -ENODEV: the device is stopping
	owned    int  // requests delivered and not yet committed
}

// setupBatch maps the element arrays and registers the fetch ring.
func (l *queueState) setupBatch() error {
	d := int(l.cfg.Depth)
	b := &batch{elemBytes: int(unsafe.Sizeof(uapi.BatchElem{}))}
	if !l.zc {
		// Copy mode names each tag's buffer in every element.
		b.elemBytes += 8
		b.flags = uapi.BatchHasBufAddr
	}
	for i := range b.want {
		b.want[i] = -1
	}
	var err error
	if b.elems, err = uring.NewBuffers(1, commitSlots*d*b.elemBytes); err != nil {
		return fmt.Errorf("batch elements: %w", err)
	}
	// The queue's slot is its provided-buffer group: unique in the ring.
	if b.fetch, err = l.ring.RegisterBufRing(l.slot, d, 2*min(d, maxTagsPerFetch)); err != nil {
		b.elems.Close()
		return fmt.Errorf("batch fetch ring: %w", err)
	}
	l.b = b
	return nil
}

func (b *batch) close() {
	if b == nil {
		return
	}
	b.fetch.Close()
	b.elems.Close()
}

// slotBytes returns element array i.
func (l *queueState) slotBytes(i int) []byte {
	size := int(l.cfg.Depth) * l.b.elemBytes
	return l.b.elems.Bytes()[i*size : (i+1)*size]
}

// prepAll queues the PREP of every tag and the FETCH, in that order (a
// FETCH before its queue is prepared is refused during recovery).
func (l *queueState) prepAll() error {
	for tag := range l.tags {
		l.putElem(uint16(tag), 0)
	}
	if err := l.sendElems(uapi.IOPrepIOCmds, 0); err != nil {
		return err
	}
	return l.armFetch()
}

// armFetch queues the multishot FETCH.
func (l *queueState) armFetch() error {
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	sqe.PrepURingCmd(l.fileChar, uapi.IOFetchIOCmds)
	sqe.Flags |= l.fileFlag | uring.IOSQE_BUFFER_SELECT
	sqe.OpFlags = uring.IORING_URING_CMD_MULTISHOT
	sqe.BufIndex = l.b.fetch.Group()
	sqe.UserData = encodeUD(udFetch, l.slot, 0)
	putBatchIO(sqe.Cmd(), l.cfg.QID, 0, 0, 2)
	l.b.fetching = true
	l.s.fetchers++
	return nil
}

// putElem adds tag's element (result for a COMMIT, 0 for the PREP) to the
// array being filled.
func (l *queueState) putElem(tag uint16, result int32) {
	b := l.b
	e := l.slotBytes(b.slot)[b.n*b.elemBytes:]
	binary.LittleEndian.PutUint16(e[0:], tag)
	var slot uint16
	if l.zc {
		// AUTO_BUF_REG: the request's pages go to the tag's fixed
		// buffer slot, which the commit also unregisters.
		slot = l.bufBase + tag
	}
	binary.LittleEndian.PutUint16(e[2:], slot)
	binary.LittleEndian.PutUint32(e[4:], uint32(result))
	if !l.zc {
		binary.LittleEndian.PutUint64(e[8:], l.bufs.addr(tag, 0))
	}
	b.n++
	if !l.inCommits {
		l.inCommits = true
		l.s.commits = append(l.s.commits, l)
	}
}

// commitBatch queues one COMMIT_IO_CMDS for the round's results, if any.
func (l *queueState) commitBatch() error {
	if l.b == nil || l.b.n == 0 {
		return nil
	}
	l.tally.commits++
	l.touched()
	return l.sendElems(uapi.IOCommitIOCmds, int32(l.b.n*l.b.elemBytes))
}

// sendElems queues op for the elements of the array being filled, which
// then waits for the CQE (want: its expected result), and moves on to the
// next array.
func (l *queueState) sendElems(op uint32, want int32) error {
	b := l.b
	sqe := l.ring.GetSQE()
	if sqe == nil {
		return errNoSQE
	}
	sqe.PrepURingCmd(l.fileChar, op)
	sqe.Flags |= l.fileFlag
	sqe.Addr = uint64(uintptr(unsafe.Pointer(&l.slotBytes(b.slot)[0])))
	sqe.UserData = encodeUD(udBatch, l.slot, uint16(b.slot))
	putBatchIO(sqe.Cmd(), l.cfg.QID, b.flags, uint16(b.n), uint8(b.elemBytes))
	b.want[b.slot] = want
	l.s.batchCmds++
	b.slot = (b.slot + 1) % commitSlots
	b.n = 0
	if b.want[b.slot] >= 0 {
		// Its CQE came in no earlier reap: the kernel deferred a
		// command it completes inline. Refilling it could corrupt
		// what it has not read yet.
		return errBatchSlotBusy
	}
	return nil
}

// putBatchIO writes struct ublk_batch_io into an SQE's cmd area.
func putBatchIO(c *[16]byte, qid, flags, nrElem uint16, elemBytes uint8) {
	*c = [16]byte{}
	binary.LittleEndian.PutUint16(c[0:], qid)
	binary.LittleEndian.PutUint16(c[2:], flags)
	binary.LittleEndian.PutUint16(c[4:], nrElem)
	c[6] = elemBytes
}

// onBatchCmd handles the CQE of a PREP or COMMIT sent from array slot. Any
// other result than the whole array's means requests the kernel will not
// complete: the queue cannot go on.
func (l *queueState) onBatchCmd(slot uint16, res int32) error {
	if int(slot) >= commitSlots || l.b.want[slot] < 0 {
		return errBadTag
	}
	want := l.b.want[slot]
	l.b.want[slot] = -1
	l.s.batchCmds--
	if b := l.b; b.ended && b.outstanding() == 0 {
		l.mayEnd()
	}
	if res == want {
		return nil
	}
	what := "commit"
	if want == 0 {
		what = "prep"
	}
	if res < 0 {
		return fmt.Errorf("%w: batch %s: %w", errCmdFailed, what, unix.Errno(-res))
	}
	return fmt.Errorf("%w: batch %s took %d of %d bytes of elements", errCmdFailed, what, res, want)
}

// onFetch handles a FETCH CQE: start every request whose tag the kernel
// wrote into the selected buffer, give the buffer back, and arm the FETCH
// again if this was its last CQE and the device goes on.
func (l *queueState) onFetch(c *uring.CQE) error {
	b := l.b
	if c.Flags&uring.IORING_CQE_F_MORE == 0 {
		b.fetching = false
		l.s.fetchers--
	}
	switch {
	case c.Res == uapi.IOResAbort:
		b.ended = true
		l.mayEnd()
		return nil
	case c.Res == -int32(unix.ENOBUFS):
		// No buffer or no CQ room: the kernel keeps the requests for
		// the FETCH armed again below.
	case c.Res < 0:
		b.ended = true
		return fmt.Errorf("%w: batch fetch: %w", errCmdFailed, unix.Errno(-c.Res))
	default:
		id, ok := uring.BufferID(c)
		if !ok {
			if c.Res > 0 {
				return fmt.Errorf("%w: batch fetch of %d bytes without a buffer", errCmdFailed, c.Res)
			}
			break
		}
		tags := b.fetch.Buf(id)[:c.Res]
		for i := 0; i+1 < len(tags); i += 2 {
			tag := binary.NativeEndian.Uint16(tags[i:])
			if int(tag) >= len(l.tags) {
				return errBadTag
			}
			b.owned++
			if err := l.accept(tag); err != nil {
				return err
			}
		}
		b.fetch.Recycle(id)
	}
	if b.fetching || l.failed {
		return nil
	}
	return l.armFetch()
}

// outstanding is how many PREP/COMMIT commands still owe their CQE.
func (b *batch) outstanding() int {
	n := 0
	for _, w := range b.want {
		if w >= 0 {
			n++
		}
	}
	return n
}

// batchDone reports whether a batch-mode queue has nothing left to do: the
// device stopped the FETCH and every delivered request was committed.
func (l *queueState) batchDone() bool {
	b := l.b
	return b.ended && b.owned == 0 && b.n == 0 && l.backing == 0 && b.outstanding() == 0
}
