package ublk

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestStalledBackingStallsOnlyItsVolume proves that a volume whose backing
// file stops answering (its filesystem frozen: writes wait in the kernel
// until the thaw) holds only its own I/O: a second volume served by the
// same server thread keeps reading and writing, at queue depth 1 beside a
// queue depth 8 load of its own, while the first one's writes are stuck,
// and both volumes' data verifies after the thaw. With the kernel's
// default cap on the thread's io-wq workers (4 per CPU), the stalled
// volume's writes held them all and every write of the other volume that
// io_uring punts (into a hole, over a stale mtime) waited for the thaw.
func TestStalledBackingStallsOnlyItsVolume(t *testing.T) {
	requireUblk(t)
	for _, opts := range []QueueOptions{
		{FixedBuffers: true},
		{FixedBuffers: true, NowaitWrites: true},
	} {
		t.Run(fmt.Sprintf("nowait=%v", opts.NowaitWrites), func(t *testing.T) {
			stalledBackingStallsOnlyItsVolume(t, opts)
		})
	}
}

func stalledBackingStallsOnlyItsVolume(t *testing.T, opts QueueOptions) {
	c := openTestCtl(t)
	th := testThread(t)
	const size = 32 << 20

	// The stalled volume's backing file lives on a filesystem of its own.
	fs := testfs.MountFreezable(t)
	stuckF, err := os.OpenFile(filepath.Join(fs.Dir, "stuck.img"), os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stuckF.Close() })
	if err := stuckF.Truncate(size); err != nil {
		t.Fatal(err)
	}
	stuck := addTestDev(t, c, 1, 32, 128<<10, 0, size)
	stuckQs, stuckPath := startQueuesOn(t, stuck, FileTarget(int(stuckF.Fd())), opts, []*dataplane.Thread{th})

	busyF, _ := backingFile(t, size)
	busy := addTestDev(t, c, 1, 32, 128<<10, 0, size)
	_, busyPath := startQueuesOn(t, busy, FileTarget(int(busyF.Fd())), opts, []*dataplane.Thread{th})
	if st := th.Stats(); st.Queues != 2 {
		t.Fatalf("thread serves %d queues, want both devices' 2", st.Queues)
	}

	// The other volume: a queue depth 8 load of random writes and reads
	// runs throughout, and beside it the queue depth 1 writes and reads
	// that are timed, first before the stall.
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	for i := range 8 {
		load.Go(func() { randomIO(t, busyPath, stopLoad, uint64(i)) })
	}
	defer func() { close(stopLoad); load.Wait() }()
	before := qd1(t, busyPath, 200, 1)

	fs.Freeze(t)
	// Thaw in any case, so that a failing test ends rather than hangs;
	// the test thaws itself long before.
	const safety = 40 * time.Second
	thaw := sync.OnceFunc(func() { fs.Thaw(t) })
	timer := time.AfterFunc(safety, thaw)
	defer func() { timer.Stop(); thaw() }()

	// Eight writers fill the stalled volume with writes that cannot end
	// before the thaw.
	const writers = 8
	var wrote sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wrote.Go(func() { errs <- writeBlock(stuckPath, w) })
	}
	err = poll(t.Context(), 30*time.Second, func() (bool, error) { return stuckQs[0].Stats().InFlight >= writers, nil })
	if err != nil {
		t.Fatalf("the stalled volume's writes are not all in service: %v, %+v", err, stuckQs[0].Stats())
	}
	stalledAt := time.Now()

	during := qd1(t, busyPath, 200, 2)

	stuckFor, inService := time.Since(stalledAt), stuckQs[0].Stats().InFlight
	t.Logf("queue depth 1 on the other volume, beside its own load: median %v, worst %v before the stall; median %v, worst %v while the stalled volume's %d writes were stuck (for %v, %d in service at the end)",
		before.median, before.worst, during.median, during.worst, writers, stuckFor.Round(time.Millisecond), inService)
	if inService < writers {
		t.Fatalf("the stalled volume has %d requests in service after %v, want its %d writes still stuck: the other volume's I/O waited for the thaw", inService, stuckFor, writers)
	}
	// Bounded, not timed: a thread that waited for the frozen
	// filesystem would not have answered until the safety thaw.
	if during.worst > 5*time.Second {
		t.Errorf("an I/O on the other volume took %v while the stalled volume's writes were stuck", during.worst)
	}

	thaw()
	wrote.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("write to the stalled volume after the thaw: %v", err)
		}
	}
	for w := range writers {
		if err := checkBlock(stuckPath, w); err != nil {
			t.Error(err)
		}
	}
}

// latencies sums up timed I/Os.
type latencies struct{ median, worst time.Duration }

// qd1 writes and reads back n blocks of 4 KiB one at a time at random
// offsets of the device's first 16 MiB, checking every read, and times
// each I/O.
func qd1(t *testing.T, dev string, n int, seed uint64) latencies {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, r := alignedBuf(t, 4096), alignedBuf(t, 4096)
	rng := rand.New(rand.NewPCG(seed, 0))
	took := make([]time.Duration, 0, 2*n)
	for i := range n {
		off := int64(rng.IntN(4096)) * 4096
		fill(w, byte(i))
		start := time.Now()
		if _, err := f.WriteAt(w, off); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
		mid := time.Now()
		if _, err := f.ReadAt(r, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		took = append(took, mid.Sub(start), time.Since(mid))
		if !bytes.Equal(w, r) {
			t.Fatalf("block at %d read back differs from what was written", off)
		}
	}
	slices.Sort(took)
	return latencies{median: took[len(took)/2], worst: took[len(took)-1]}
}

// randomIO writes and reads 4 KiB blocks in the device's second 16 MiB
// until stop closes.
func randomIO(t *testing.T, dev string, stop <-chan struct{}, seed uint64) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	b := alignedBuf(t, 4096)
	rng := rand.New(rand.NewPCG(seed, 1))
	for {
		select {
		case <-stop:
			return
		default:
		}
		off := int64(16<<20) + int64(rng.IntN(4096))*4096
		var err error
		if rng.IntN(2) == 0 {
			_, err = f.WriteAt(b, off)
		} else {
			_, err = f.ReadAt(b, off)
		}
		if err != nil {
			t.Errorf("I/O at %d: %v", off, err)
			return
		}
	}
}

// writeBlock writes block i (64 KiB at i·1 MiB) of the pattern seeded i.
func writeBlock(dev string, i int) error {
	f, err := os.OpenFile(dev, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(b)
	fill(b, byte(i))
	_, err = f.WriteAt(b, int64(i)<<20)
	return err
}

// checkBlock reads block i back and compares it with what writeBlock wrote.
func checkBlock(dev string, i int) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	got, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(got)
	if _, err := f.ReadAt(got, int64(i)<<20); err != nil {
		return fmt.Errorf("read block %d of the stalled volume: %w", i, err)
	}
	want := make([]byte, len(got))
	fill(want, byte(i))
	if !bytes.Equal(got, want) {
		return fmt.Errorf("block %d of the stalled volume differs after the thaw", i)
	}
	return nil
}
