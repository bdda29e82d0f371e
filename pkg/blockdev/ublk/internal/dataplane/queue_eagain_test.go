package dataplane

import (
	"bytes"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// serveCounting drives one request of tag from arrival to its COMMIT and
// returns how many backing completions it took.
func serveCounting(t *testing.T, l *queueState, tag uint16) (attempts int) {
	t.Helper()
	if err := l.onCmd(tag, uapi.IOResOK); err != nil {
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
// -EAGAIN, driven by the queue's FaultEAGAIN failpoint: up to MaxEAGAIN
// such answers the operation is issued again and the request completes
// with its data; one more and the request is completed with an error (the
// kernel gets -EIO: TestQueueEAGAIN, on a real device) after exactly
// MaxEAGAIN retries, and the queue goes on serving other requests.
func TestLoopEAGAIN(t *testing.T) {
	for _, c := range []struct {
		name   string
		op     uint32
		faults int32
	}{
		{"read, one EAGAIN", uapi.IOOpRead, 1},
		{"read, maxEAGAIN", uapi.IOOpRead, MaxEAGAIN},
		{"write, maxEAGAIN", uapi.IOOpWrite, MaxEAGAIN},
		{"read, one over maxEAGAIN", uapi.IOOpRead, MaxEAGAIN + 1},
		{"write, one over maxEAGAIN", uapi.IOOpWrite, MaxEAGAIN + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, f := hostLoop(t, 4, TargetFile)
			data := bytes.Repeat([]byte("EAGAIN!\n"), 512) // 4 KiB at sector 8
			if c.op == uapi.IOOpRead {
				if _, err := f.WriteAt(data, 8*512); err != nil {
					t.Fatal(err)
				}
			} else {
				copy(l.bufs.slice(1), data)
			}
			fails := c.faults > MaxEAGAIN
			injectEAGAIN(t, l.q, c.faults)
			setDesc(l, 1, c.op, 8, 8)
			attempts := serveCounting(t, l, 1)
			if want := int(min(c.faults, MaxEAGAIN) + 1); attempts != want {
				t.Fatalf("%d backing attempts, want %d", attempts, want)
			}
			if left := l.q.eagainLeft(); left != 0 {
				t.Fatalf("%d EAGAIN faults left unconsumed", left)
			}
			st := l.statsNow()
			if got := st.Errors == 1; got != fails || st.InFlight != 0 {
				t.Fatalf("stats %+v: want failed %v, nothing in flight", st, fails)
			}
			if !fails {
				got := make([]byte, len(data))
				if c.op == uapi.IOOpWrite {
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
			if st := l.statsNow(); st.Errors != 1 {
				t.Fatalf("stats %+v after the failed request, want one error", st)
			}
		})
	}
}
