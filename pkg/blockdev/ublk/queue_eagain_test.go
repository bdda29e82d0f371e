package ublk

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestQueueEAGAIN proves on a real device that what the retry path does
// reaches the kernel: a read whose backing operation answers -EAGAIN
// MaxEAGAIN times returns its data, one answering it once more fails with
// EIO, and the queue then serves reads and writes as before.
func TestQueueEAGAIN(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	const size = 16 << 20
	f, _ := backingFile(t, size)
	d := addTestDev(t, c, 1, 32, 128<<10, 0, size)
	qs, dev := startQueues(t, d, FileTarget(int(f.Fd())), QueueOptions{})
	q := qs[0]
	want := alignedBuf(t, 4096)
	fill(want, 0x3c)
	if _, err := f.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Opening the disk waits for its partition scan, so only the
	// test's requests meet the failpoint.
	bd, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	got := alignedBuf(t, 4096)
	read := func() error {
		clear(got)
		_, err := bd.ReadAt(got, 1<<20)
		return err
	}
	injectEAGAIN(t, q, dataplane.MaxEAGAIN)
	if err := read(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after %d EAGAINs: %v, data equal %v", dataplane.MaxEAGAIN, err, bytes.Equal(got, want))
	}
	injectEAGAIN(t, q, dataplane.MaxEAGAIN+1)
	if err := read(); !errors.Is(err, unix.EIO) {
		t.Fatalf("read after %d EAGAINs = %v, want EIO", dataplane.MaxEAGAIN+1, err)
	}
	if n := eagainLeft(q); n != 0 {
		t.Fatalf("%d EAGAIN faults left unconsumed", n)
	}
	if err := read(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after the failed one: %v, data equal %v", err, bytes.Equal(got, want))
	}
	fill(want, 0xa5)
	if _, err := bd.WriteAt(want, 2<<20); err != nil {
		t.Fatalf("write after the failed read: %v", err)
	}
	back := alignedBuf(t, 4096)
	if _, err := f.ReadAt(back, 2<<20); err != nil || !bytes.Equal(back, want) {
		t.Fatalf("backing file after the write: %v, equal %v", err, bytes.Equal(back, want))
	}
	if err := q.Err(); err != nil {
		t.Fatalf("queue failed: %v", err)
	}
	if st := q.Stats(); st.Errors != 1 {
		t.Fatalf("stats %+v, want one error", st)
	}
}
