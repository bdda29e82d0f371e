package ublk

import (
	"bytes"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestQueueIdleReclaim proves, on the real kernel, that a copy-mode queue
// gives back the buffer memory a burst of large I/O made resident once it
// has been idle for IdleReclaim, and that I/O after the reclaim moves the
// right bytes through the re-faulted buffers. It counts the buffers' own
// resident pages (mincore, from the server thread): the process's RssAnon
// moves with the Go heap too, and on 7.3 it once showed only 2.4 of 8 MiB
// given back while the buffers themselves were empty.
func TestQueueIdleReclaim(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	const size, depth, maxIO = 64 << 20, 16, 512 << 10
	f, _ := backingFile(t, size)
	d := addTestDev(t, c, 1, depth, maxIO, 0, size)
	qs, dev := startQueuesOn(t, d, FileTarget(int(f.Fd())), QueueOptions{FixedBuffers: true, IdleReclaim: 500 * time.Millisecond}, []*dataplane.Thread{th})
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	// Writes of a whole buffer each, all at once, so that the tags'
	// buffers fill: up to 16 × 512 KiB = 8 MiB resident.
	bufs := make([][]byte, depth)
	for i := range bufs {
		bufs[i] = alignedBuf(t, maxIO)
		fill(bufs[i], byte(i))
	}
	errs := make(chan error, depth)
	for i := range bufs {
		go func() {
			_, err := bd.WriteAt(bufs[i], int64(i)*maxIO)
			errs <- err
		}()
	}
	for range bufs {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	// How many tags the writes used depends on how many the kernel had in
	// flight at once (under emulation sometimes only a few), so at least
	// one whole buffer's tail must be resident, not a fixed share.
	page := unix.Getpagesize()
	busy, reg, _ := bufPages(t, th)
	if busy-reg < (maxIO-dataplane.FixedHeadBytes)/page {
		t.Fatalf("after 8 MiB of writes: %d buffer pages resident, %d registered: no tag's buffer tail filled", busy, reg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for qs[0].Stats().Reclaims == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no reclaim 10 s after the last request (stats %+v)", qs[0].Stats())
		}
		time.Sleep(100 * time.Millisecond)
	}
	idle, reg, _ := bufPages(t, th)
	t.Logf("buffer pages resident: %d after 8 MiB of writes, %d after the idle reclaim (%d registered, which stay)", busy, idle, reg)
	if idle > reg {
		t.Fatalf("after the idle reclaim %d buffer pages are resident, more than the %d registered heads: tails were kept", idle, reg)
	}
	got := alignedBuf(t, maxIO)
	for i := range bufs {
		if _, err := bd.ReadAt(got, int64(i)*maxIO); err != nil || !bytes.Equal(got, bufs[i]) {
			t.Fatalf("chunk %d reads back differently after the reclaim (err %v)", i, err)
		}
	}
}

// TestQueueRegistersHeadsOnDemand proves that copy mode pins only the
// buffer heads its requests use: a started device of 1024 tags has next to
// no buffer page resident (it registered, and so pinned, 16 KiB of every
// tag's buffer at start before: 4096 pages), 4 KiB requests register and make
// resident one page per tag they use, and requests of every size still read
// and write the right data once registrations have grown (never past
// FixedHeadBytes).
func TestQueueRegistersHeadsOnDemand(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	th := testThread(t)
	const size, queues, depth = 64 << 20, 4, 256
	f, _ := backingFile(t, size)
	d := addTestDev(t, c, queues, depth, 128<<10, 0, size)
	_, dev := startQueuesOn(t, d, FileTarget(int(f.Fd())), QueueOptions{FixedBuffers: true}, []*dataplane.Thread{th})
	// The kernel reads a few blocks of a new disk (partition scan, udev):
	// those requests register their pages; nothing else is resident.
	if res, reg, _ := bufPages(t, th); res > 64 || res > reg {
		t.Fatalf("started device: %d buffer pages resident, %d registered, want next to none (4096 with every head registered)", res, reg)
	}
	bd, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	// 4 KiB reads, many in flight at once, several rounds.
	const readers = 64
	errs := make(chan error, readers)
	for i := range readers {
		buf := alignedBuf(t, 4096)
		go func() {
			var err error
			for j := range 64 {
				if _, err = bd.ReadAt(buf, int64((i*64+j)%(size/4096))*4096); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range readers {
		if err := <-errs; err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	res, reg, most := bufPages(t, th)
	t.Logf("after 4 KiB reads: %d buffer pages resident, %d registered, at most %d per tag", res, reg, most)
	if reg == 0 || most != 1 || res > reg {
		t.Fatalf("after 4 KiB reads: %d pages resident, %d registered, at most %d per tag: want one registered page per tag used, nothing else resident", res, reg, most)
	}
	checkReadWrite(t, dev, f)
	checkParallel(t, dev)
	if _, _, most := bufPages(t, th); most > dataplane.FixedHeadBytes/unix.Getpagesize() {
		t.Fatalf("a tag registered %d pages, more than the %d of FixedHeadBytes", most, dataplane.FixedHeadBytes/unix.Getpagesize())
	}
}
