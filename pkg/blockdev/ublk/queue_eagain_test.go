package ublk

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serveCounting drives one request of tag from arrival to its COMMIT and
// returns how many backing completions it took.
func serveCounting(t *testing.T, l *loop, tag uint16) (attempts int) {
	t.Helper()
	if err := l.onCmd(tag, ioResOK); err != nil {
		t.Fatalf("onCmd: %v", err)
	}
	for committed := false; !committed; {
		if _, err := l.ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatalf("submit and wait: %v", err)
		}
		n := l.ring.Reap(l.s.cqes)
		for i := range n {
			c := &l.s.cqes[i]
			kind, _, ctag := decodeUD(c.UserData)
			if kind == udCmd { // the COMMIT (it fails on a regular file)
				committed = true
				continue
			}
			attempts++
			if err := l.onBacking(ctag, c.Res); err != nil {
				t.Fatalf("onBacking: %v", err)
			}
		}
	}
	return attempts
}

// TestLoopEAGAIN proves the retry path of a backing operation answered
// -EAGAIN, driven by the queue's faultEAGAIN failpoint: up to maxEAGAIN
// such answers the operation is issued again and the request completes
// with its data; one more and the request is completed with an error (the
// kernel gets -EIO: TestQueueEAGAIN, on a real device) after exactly
// maxEAGAIN retries, and the queue goes on serving other requests.
func TestLoopEAGAIN(t *testing.T) {
	for _, c := range []struct {
		name   string
		op     uint32
		faults int32
	}{
		{"read, one EAGAIN", ioOpRead, 1},
		{"read, maxEAGAIN", ioOpRead, maxEAGAIN},
		{"write, maxEAGAIN", ioOpWrite, maxEAGAIN},
		{"read, one over maxEAGAIN", ioOpRead, maxEAGAIN + 1},
		{"write, one over maxEAGAIN", ioOpWrite, maxEAGAIN + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, f := hostLoop(t, 4, TargetFile)
			data := bytes.Repeat([]byte("EAGAIN!\n"), 512) // 4 KiB at sector 8
			if c.op == ioOpRead {
				if _, err := f.WriteAt(data, 8*512); err != nil {
					t.Fatal(err)
				}
			} else {
				copy(l.bufs.slice(1), data)
			}
			fails := c.faults > maxEAGAIN
			l.q.faultEAGAIN.Store(c.faults)
			setDesc(l, 1, c.op, 8, 8)
			attempts := serveCounting(t, l, 1)
			if want := int(min(c.faults, maxEAGAIN) + 1); attempts != want {
				t.Fatalf("%d backing attempts, want %d", attempts, want)
			}
			if left := l.q.faultEAGAIN.Load(); left != 0 {
				t.Fatalf("%d EAGAIN faults left unconsumed", left)
			}
			st := l.q.stats.snapshot()
			if got := st.Errors == 1; got != fails || st.InFlight != 0 {
				t.Fatalf("stats %+v: want failed %v, nothing in flight", st, fails)
			}
			if !fails {
				got := make([]byte, len(data))
				if c.op == ioOpWrite {
					if _, err := f.ReadAt(got, 8*512); err != nil {
						t.Fatal(err)
					}
				} else {
					copy(got, l.bufs.slice(1))
				}
				if !bytes.Equal(got, data) {
					t.Fatal("request completed with the wrong data")
				}
				return
			}
			if l.failed || l.q.Err() != nil {
				t.Fatalf("queue failed after one request's EAGAIN limit: %v", l.q.Err())
			}
			// The queue serves on: the same tag and others, both ways.
			roundTrip(t, l, f, bytes.Repeat([]byte("serving "), 2048), 64, 0)
			if st := l.q.stats.snapshot(); st.Errors != 1 {
				t.Fatalf("stats %+v after the failed request, want one error", st)
			}
		})
	}
}

// TestQueueEAGAIN proves on a real device that what the retry path does
// reaches the kernel: a read whose backing operation answers -EAGAIN
// maxEAGAIN times returns its data, one answering it once more fails with
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
	q.faultEAGAIN.Store(maxEAGAIN)
	if err := read(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after %d EAGAINs: %v, data equal %v", maxEAGAIN, err, bytes.Equal(got, want))
	}
	q.faultEAGAIN.Store(maxEAGAIN + 1)
	if err := read(); !errors.Is(err, unix.EIO) {
		t.Fatalf("read after %d EAGAINs = %v, want EIO", maxEAGAIN+1, err)
	}
	if n := q.faultEAGAIN.Load(); n != 0 {
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
