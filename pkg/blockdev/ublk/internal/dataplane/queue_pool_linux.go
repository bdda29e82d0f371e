package dataplane

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The buffer pool of a USER_COPY queue. With USER_COPY the kernel never
// writes into the server's buffers on its own, so a request needs memory
// only from its copy or backing I/O to its commit, and the memory need not
// belong to its tag: each tag keeps a small buffer (UserCopyTagBytes, the
// whole of it registered as the tag's fixed buffer) for the small requests
// of random I/O, and a larger request borrows a run of chunks of the
// queue's pool (first fit) until its commit. The pool, not depth × max
// I/O, is what large requests cost: the device can take 1 MiB requests
// within the memory budget that limits copy mode to 128 KiB. A request
// that finds no run free waits, behind those that wait already, for the
// commits of earlier ones.

// UserCopyTagBytes is the buffer of each tag of a USER_COPY queue: the
// small requests of random I/O and database pages fit it, and its pages
// are registered (pinned) as they are used, as copy mode registers the
// heads of its buffers (FixedHeadBytes).
const UserCopyTagBytes = FixedHeadBytes

// mapQueueMemory maps a copy-mode queue's buffers: one of MaxIOBytes per
// tag, or with USER_COPY (uc) one of UserCopyTagBytes per tag and a pool of
// PoolBytes for the larger requests.
func mapQueueMemory(cfg *QueueConfig, uc bool) (*bufArea, *bufPool, error) {
	if !uc || cfg.MaxIOBytes <= UserCopyTagBytes {
		bufs, err := mapBuffers(cfg.Depth, cfg.MaxIOBytes)
		return bufs, nil, err
	}
	bufs, err := mapBuffers(cfg.Depth, UserCopyTagBytes)
	if err != nil {
		return nil, nil, err
	}
	size := max(cfg.PoolBytes, roundUp(int(cfg.MaxIOBytes), bufs.size))
	pool, err := mapPool(size, bufs.size, cfg.Depth)
	if err != nil {
		bufs.close()
		return nil, nil, err
	}
	return bufs, pool, nil
}

// bufPool is a USER_COPY queue's pool: one anonymous mapping of chunks,
// lent in runs.
type bufPool struct {
	mem   []byte
	chunk int
	runs  rangeAlloc
	// waiting are the tags whose requests wait for a run, a ring of
	// waitLen from waitHead in arrival order.
	waiting           []uint16
	waitHead, waitLen int
}

// mapPool maps a pool of size bytes in chunks of chunk bytes for a queue
// of depth tags.
func mapPool(size, chunk int, depth uint16) (*bufPool, error) {
	n := size / chunk
	mem, err := unix.Mmap(-1, 0, n*chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap buffer pool of %d bytes: %w", n*chunk, err)
	}
	// As for the tag buffers (mapBuffers): no huge pages, so that the
	// pool is resident as far as requests used it.
	if err := unix.Madvise(mem, unix.MADV_NOHUGEPAGE); err != nil && !errors.Is(err, unix.EINVAL) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("madvise buffer pool: %w", err)
	}
	p := &bufPool{mem: mem, chunk: chunk, runs: newRangeAlloc(n), waiting: make([]uint16, depth)}
	// At most one free run more than runs lent, and at most one lent
	// per tag: room enough that giving runs back never allocates.
	p.runs.runs = append(make([][2]int, 0, int(depth)+1), p.runs.runs...)
	return p, nil
}

// take lends t's request a run of the pool, unless others wait already or
// no run is free: it reports whether it did.
func (p *bufPool) take(t *tagState) bool {
	return p.waitLen == 0 && p.lend(t)
}

// lend lends t's request a run if one is free.
func (p *bufPool) lend(t *tagState) bool {
	chunks := (int(t.req.len) + p.chunk - 1) / p.chunk
	start, ok := p.runs.alloc(chunks)
	if ok {
		t.run, t.runLen = int32(start), int32(chunks)
	}
	return ok
}

// give takes back tag's run.
func (p *bufPool) give(t *tagState) {
	p.runs.free(int(t.run), int(t.runLen))
	t.runLen = 0
}

// run is the memory of t's run.
func (p *bufPool) run(t *tagState) []byte {
	return p.mem[int(t.run)*p.chunk : int(t.run+t.runLen)*p.chunk]
}

// drop gives the pages of the whole pool back to the kernel; no run may be
// lent.
func (p *bufPool) drop() error {
	if p == nil || p.mem == nil {
		return nil
	}
	return unix.Madvise(p.mem, unix.MADV_DONTNEED)
}

func (p *bufPool) close() error {
	if p == nil || p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}

// needsRun reports whether tag's request takes a run of the pool: a read
// or write larger than the tag's own buffer, without one yet.
func (l *queueState) needsRun(t *tagState) bool {
	return l.pool != nil && t.runLen == 0 && t.req.len > uint32(l.bufs.size) &&
		(t.plan.act == actRead || t.plan.act == actWrite)
}

// waitRun queues tag behind the requests that wait for a run. It counts as
// a backing operation for Pause (Queue.Settled), as a request held for a
// disk slot does: it passed the gate and will reach the file.
func (l *queueState) waitRun(tag uint16) {
	p := l.pool
	p.waiting[(p.waitHead+p.waitLen)%len(p.waiting)] = tag
	p.waitLen++
	l.tally.backing++
	l.tally.poolWaits++
	l.touched()
}

// giveRun takes back t's run at its commit, and issues the requests
// waiting for one, in order, as far as the pool now has room.
func (l *queueState) giveRun(t *tagState) {
	p := l.pool
	p.give(t)
	for p.waitLen > 0 && !l.failed {
		tag := p.waiting[p.waitHead]
		if !p.lend(&l.tags[tag]) {
			return
		}
		p.waitHead = (p.waitHead + 1) % len(p.waiting)
		p.waitLen--
		l.tally.backing-- // counted again by issue
		if err := l.issue(tag); err != nil {
			l.fail(err)
		}
	}
}

// dropWaiting forgets the requests that wait for a run when the queue
// failed: they stay with the kernel, which gives them to the next server.
func (l *queueState) dropWaiting() {
	if l.pool != nil && l.pool.waitLen > 0 {
		l.tally.backing -= int64(l.pool.waitLen)
		l.pool.waitLen = 0
		l.touched()
	}
}

// data is the memory tag's request goes through: its run of the pool, or
// the tag's own buffer.
func (l *queueState) data(tag uint16) []byte {
	if t := &l.tags[tag]; t.runLen > 0 {
		return l.pool.run(t)
	}
	return l.bufs.slice(tag)
}

// dataAddr is the address of byte off of tag's data, for an SQE.
func (l *queueState) dataAddr(tag uint16, off uint32) uint64 {
	return addrOf(l.data(tag)) + uint64(off)
}
