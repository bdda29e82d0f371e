package ublk

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// backingFile creates a sparse file of size bytes and opens it O_DIRECT.
func backingFile(t *testing.T, size int64) (*os.File, string) {
	t.Helper()
	// t.TempDir is under $TMPDIR, which the VM puts on its ext4 disk:
	// O_DIRECT needs a real filesystem.
	path := filepath.Join(t.TempDir(), "vol.img")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatalf("open backing: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f, path
}

// alignedBuf returns n bytes of page-aligned memory for O_DIRECT I/O.
func alignedBuf(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
}

type queueCase struct {
	name   string
	flags  uint64
	queues uint16
	fixed  bool
	nowait bool   // QueueOptions.NowaitWrites
	inline uint32 // QueueOptions.CopyInlineBytes
}

func queueCases(t *testing.T, c *Control) []queueCase {
	cases := []queueCase{{"copy/1q", 0, 1, false, false, 0}, {"copy/2q", 0, 2, false, false, 0},
		{"copy-fixed/2q", 0, 2, true, false, 0}, {"copy-nowait/2q", 0, 2, true, true, 0}}
	if features(t, c)&FlagUserCopy != 0 {
		cases = append(cases, queueCase{"usercopy/1q", FlagUserCopy, 1, false, false, 0},
			queueCase{"usercopy-fixed/2q", FlagUserCopy, 2, true, false, 0},
			queueCase{"usercopy-nowait/2q", FlagUserCopy, 2, true, true, 0},
			queueCase{"usercopy-inline/2q", FlagUserCopy, 2, true, false, math.MaxUint32})
	} else {
		testgate.Without(t, testgate.UserCopy, "kernel has no USER_COPY (features %#x): user copy not tested", features(t, c))
	}
	if features(t, c)&FlagAutoBufReg != 0 {
		cases = append(cases, queueCase{"autobuf/1q", FlagAutoBufReg, 1, false, false, 0},
			queueCase{"autobuf/2q", FlagAutoBufReg, 2, false, false, 0}, queueCase{"autobuf-nowait/2q", FlagAutoBufReg, 2, false, true, 0})
	} else {
		testgate.Without(t, testgate.ZeroCopy, "kernel has no AUTO_BUF_REG (features %#x): zero copy not tested", features(t, c))
	}
	if features(t, c)&FlagBatchIO != 0 {
		cases = append(cases, queueCase{"batch-copy/2q", FlagBatchIO, 2, true, false, 0},
			queueCase{"batch-autobuf/1q", FlagBatchIO | FlagAutoBufReg, 1, false, false, 0},
			queueCase{"batch-autobuf-nowait/2q", FlagBatchIO | FlagAutoBufReg, 2, false, true, 0})
	} else {
		testgate.Without(t, testgate.BatchIO, "kernel has no BATCH_IO (features %#x): batch mode not tested", features(t, c))
	}
	return cases
}

// startQueues starts every queue of d, each on a server thread of its
// own (testThread), then the device.
func startQueues(t *testing.T, d *testDev, tgt Target, opts QueueOptions) ([]*dataplane.Queue, string) {
	ths := make([]*dataplane.Thread, d.info.NrHWQueues)
	for i := range ths {
		ths[i] = testThread(t)
	}
	return startQueuesOn(t, d, tgt, opts, ths)
}

// startQueuesOn starts every queue of d on the server threads ths (by
// queue id, round robin), then the device.
func startQueuesOn(t *testing.T, d *testDev, tgt Target, opts QueueOptions, ths []*dataplane.Thread) ([]*dataplane.Queue, string) {
	t.Helper()
	var qs []*dataplane.Queue
	for qid := range d.info.NrHWQueues {
		q, err := dataplane.StartQueue(dataplane.QueueConfig{DevID: d.info.DevID, QID: qid, Depth: d.info.QueueDepth,
			CharFD: d.charFD, Flags: d.info.Flags, MaxIOBytes: d.info.MaxIOBufBytes, Thread: ths[int(qid)%len(ths)],
			Target: tgt, Options: opts})
		if err != nil {
			t.Fatalf("start queue %d: %v", qid, err)
		}
		qs = append(qs, q)
	}
	t.Cleanup(func() {
		d.stop()
		for _, q := range qs {
			q.Wait()
		}
	})
	return qs, d.start(t)
}

func TestQueueDataPath(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	for _, qc := range queueCases(t, c) {
		t.Run(qc.name, func(t *testing.T) {
			const size = 64 << 20
			f, path := backingFile(t, size)
			d := addTestDev(t, c, qc.queues, 64, 512<<10, qc.flags, size)
			opts := QueueOptions{FixedBuffers: qc.fixed, NowaitWrites: qc.nowait, CopyInlineBytes: qc.inline}
			var tc ThreadConfig
			if qc.nowait {
				// The writes NOWAIT refuses (the backing file is
				// sparse) then all go through one io-wq worker per
				// thread: the cap must slow them, never lose or hang them.
				tc.IOWQWorkers = 1
			}
			ths := []*dataplane.Thread{testThreadOf(t, tc), testThreadOf(t, tc)}
			qs, dev := startQueuesOn(t, d, FileTarget(int(f.Fd())), opts, ths)
			checkReadWrite(t, dev, f)
			checkParallel(t, dev)
			checkDiscard(t, dev, path)
			if err := d.stop(); err != nil {
				t.Fatalf("stop dev: %v", err)
			}
			var total QueueStats
			for _, q := range qs {
				if err := q.Wait(); err != nil {
					t.Fatalf("queue wait after STOP_DEV: %v", err)
				}
				total = total.Add(q.Stats())
			}
			if total.Reads == 0 || total.Writes == 0 || total.Flushes == 0 || total.Discards == 0 || total.InFlight != 0 {
				t.Fatalf("stats = %+v", total)
			}
			requests := total.Reads + total.Writes + total.Flushes + total.Discards + total.WriteZeroes
			if batched := d.info.Flags&FlagBatchIO != 0; batched != (qc.flags&FlagBatchIO != 0) {
				t.Fatalf("device flags %s: BATCH_IO %v, asked %v", FormatFlags(d.info.Flags), batched, !batched)
			} else if batched && total.Commits >= requests || !batched && total.Commits != requests {
				t.Fatalf("%d commits for %d requests (batch mode %v)", total.Commits, requests, batched)
			}
			if !qc.nowait && total.NowaitRefused+total.NowaitPauses+total.MtimeUpdates != 0 {
				t.Fatalf("NOWAIT refusals or mtime updates counted with NowaitWrites off: %+v", total)
			}
			// The 1 MiB and 2 MiB I/O of checkReadWrite arrives in
			// requests larger than DefaultCopyInlineBytes.
			if offload := qc.flags&FlagUserCopy != 0 && qc.inline == 0; offload != (total.CopyOffloads > 0) {
				t.Fatalf("%d requests copied by io-wq, want some: %v (flags %s, inline up to %d)",
					total.CopyOffloads, offload, FormatFlags(d.info.Flags), qc.inline)
			}
			if qc.nowait && total.MtimeUpdates == 0 {
				t.Fatalf("NowaitWrites on, but no queue updated the backing file's mtime before its writes: %+v", total)
			}
			t.Logf("stats: reads %d writes %d flushes %d discards %d zeroes %d errors %d commits %d nowait refused %d pauses %d mtime updates %d copy offloads %d",
				total.Reads, total.Writes, total.Flushes, total.Discards, total.WriteZeroes, total.Errors, total.Commits,
				total.NowaitRefused, total.NowaitPauses, total.MtimeUpdates, total.CopyOffloads)
		})
	}
}

// checkReadWrite writes patterns of several sizes through the device with
// O_DIRECT, FUA and fsync, reads them back, and checks the backing file.
func checkReadWrite(t *testing.T, dev string, backing *os.File) {
	t.Helper()
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dev, err)
	}
	defer bd.Close()
	for _, tc := range []struct {
		name string
		off  int64
		n    int
	}{{"4k", 0, 4096}, {"64k", 1 << 20, 64 << 10}, {"1M", 8 << 20, 1 << 20}, {"2M split", 16 << 20, 2 << 20}, {"last 4k", 64<<20 - 4096, 4096}} {
		w, r := alignedBuf(t, tc.n), alignedBuf(t, tc.n)
		fill(w, byte(tc.off>>12))
		if _, err := bd.WriteAt(w, tc.off); err != nil {
			t.Fatalf("%s: write: %v", tc.name, err)
		}
		if _, err := bd.ReadAt(r, tc.off); err != nil || !bytes.Equal(w, r) {
			t.Fatalf("%s: read back differs (err %v)", tc.name, err)
		}
		clear(r)
		if _, err := backing.ReadAt(r, tc.off); err != nil || !bytes.Equal(w, r) {
			t.Fatalf("%s: backing file differs (err %v)", tc.name, err)
		}
	}
	fua, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fua.Close()
	w := alignedBuf(t, 4096)
	fill(w, 99)
	if _, err := fua.WriteAt(w, 4096); err != nil {
		t.Fatalf("fua write: %v", err)
	}
	if err := bd.Sync(); err != nil {
		t.Fatalf("fsync device: %v", err)
	}
}

// checkParallel keeps many requests in flight at once (more than one
// queue's depth): goroutines write distinct patterns to their own regions
// in several sizes and read them back.
func checkParallel(t *testing.T, dev string) {
	t.Helper()
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	const workers, region = 96, 256 << 10
	errs := make(chan error, workers)
	for id := range workers {
		w, r := alignedBuf(t, region/4), alignedBuf(t, region/4)
		go func() {
			errs <- parallelWorker(bd, int64(40<<20)+int64(id)*region/4, byte(id), w, r)
		}()
	}
	// Every worker ends before the test may fail: the buffers they use
	// are unmapped at its cleanup.
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		t.Fatal(first)
	}
}

// parallelWorker writes and verifies chunks of 4 KiB up to len(w) at base.
func parallelWorker(bd *os.File, base int64, seed byte, w, r []byte) error {
	for n := 4096; n <= len(w); n *= 4 {
		fill(w[:n], seed+byte(n>>12))
		if _, err := bd.WriteAt(w[:n], base); err != nil {
			return fmt.Errorf("write %d at %d: %w", n, base, err)
		}
		if _, err := bd.ReadAt(r[:n], base); err != nil {
			return fmt.Errorf("read %d at %d: %w", n, base, err)
		}
		if !bytes.Equal(w[:n], r[:n]) {
			return fmt.Errorf("%d bytes at %d read back differently", n, base)
		}
	}
	return nil
}

// checkDiscard discards and zeroes ranges and checks the data and that the
// backing file gave the discarded space back.
func checkDiscard(t *testing.T, dev, path string) {
	t.Helper()
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	const off, n = 32 << 20, 8 << 20
	w := alignedBuf(t, n)
	fill(w, 7)
	if _, err := bd.WriteAt(w, off); err != nil {
		t.Fatal(err)
	}
	if err := bd.Sync(); err != nil {
		t.Fatal(err)
	}
	before := blocks(t, path)
	rng := [2]uint64{off, n}
	if err := ioctlRange(bd, unix.BLKDISCARD, &rng); err != nil {
		t.Fatalf("BLKDISCARD: %v", err)
	}
	if after := blocks(t, path); before-after < n/512/2 {
		t.Fatalf("discard freed %d sectors of %d", before-after, n/512)
	}
	fill(w, 8)
	if _, err := bd.WriteAt(w[:1<<20], off); err != nil {
		t.Fatal(err)
	}
	rng = [2]uint64{off, 1 << 20}
	if err := ioctlRange(bd, unix.BLKZEROOUT, &rng); err != nil {
		t.Fatalf("BLKZEROOUT: %v", err)
	}
	r := alignedBuf(t, 1<<20)
	r[0] = 1
	if _, err := bd.ReadAt(r, off); err != nil || !bytes.Equal(r, make([]byte, 1<<20)) {
		t.Fatalf("zeroed range reads non-zero (err %v)", err)
	}
}

func blocks(t *testing.T, path string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

func ioctlRange(f *os.File, req uint, rng *[2]uint64) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(rng)))
	if e != 0 {
		return e
	}
	return nil
}

func TestQueueNullTarget(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	d := addTestDev(t, c, 1, 32, 128<<10, 0, 16<<20)
	qs, dev := startQueues(t, d, NullTarget(), QueueOptions{})
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(t, 64<<10)
	for i := range 16 {
		if _, err := bd.WriteAt(buf, int64(i)<<16); err != nil {
			t.Fatalf("null write: %v", err)
		}
		if _, err := bd.ReadAt(buf, int64(i)<<16); err != nil {
			t.Fatalf("null read: %v", err)
		}
	}
	bd.Close()
	if st := qs[0].Stats(); st.Reads < 16 || st.Writes < 16 {
		t.Fatalf("stats = %+v", st)
	}
}
