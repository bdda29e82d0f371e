package peer

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testfs"
)

// flood opens n data streams of s1-n1 at 1 B/s on conns connections of
// id's to the server at addr, keeps those the server accepts reading
// until ctx ends, and returns how many were accepted and the codes of the
// refused.
func flood(ctx context.Context, t *testing.T, ca *CA, id Identity, addr string, n, conns int) (accepted int, refused map[codes.Code]int) {
	t.Helper()
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		cs[i] = grpcConn(t, ca, id, addr)
	}
	var mu sync.Mutex
	var answered sync.WaitGroup
	refused = map[codes.Code]int{}
	for i := range n {
		answered.Add(1)
		go func() {
			st, err := rawStream(ctx, cs[i%conns], &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1", Rate: 1})
			mu.Lock()
			if err != nil {
				refused[status.Code(err)]++
			} else {
				accepted++
			}
			mu.Unlock()
			answered.Done()
			for err == nil {
				err = st.RecvMsg(new(Frame))
			}
		}()
	}
	answered.Wait()
	return accepted, refused
}

// TestFlood: one peer (n2) opens 300 data streams at 1 B/s: the server
// holds at most its limit per peer (the rest ResourceExhausted at once),
// and another peer's (n3's) transfer still gets a stream and completes,
// its data exact. How long it takes, alone and during the flood, is
// logged, not asserted (a loaded machine stretches both); the figures
// are in docs/peer.md ("Bounded peers"):
//
//	go test -race -count=1 -run TestFlood -v ./pkg/peer
func TestFlood(t *testing.T) {
	const streams, conns = 300, 20
	flooded, _ := sparseSource(t, 64<<20, [][2]int64{{0, 64 << 20}}) // 64 s at the least rate
	src, _ := sparseSource(t, 64<<20, [][2]int64{{0, 32 << 20}})
	ca := newCA(t)
	h := &recorder{files: map[string]string{"s1-n1": flooded, "s2-n1": src}}
	addr, srv := serveWithin(t, newCreds(t, ca, n1), h, DefaultLimits)
	c3 := NewClient(newCreds(t, ca, n3), Static{"n1": {Node: "n1", Addr: addr}})
	transfer := func() time.Duration {
		t.Helper()
		sink := newFileSink(t)
		// No deadline short of a hang's: on a loaded machine (-race, two
		// cores shared) the transfer took more than callCtx's 10 s.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		if _, err := c3.ReadData(ctx, "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s2-n1"}, sink, time.Minute); err != nil {
			t.Fatalf("n3's transfer: %v", err)
		}
		took := time.Since(start)
		testfs.SamePrefix(t, src, sink.path)
		return took
	}
	alone := transfer()
	goroutines := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	accepted, refused := flood(ctx, t, ca, n2, addr, streams, conns)
	answered := time.Since(start)
	held, during := srv.Streams(), runtime.NumGoroutine()
	flooded3 := transfer()
	after := srv.Streams()
	cancel()

	t.Logf("flood: %d streams of n2 at 1 B/s on %d connections, all answered in %v: %d accepted, refused %v",
		streams, conns, answered.Round(time.Millisecond), accepted, refused)
	t.Logf("server: %d streams held during the flood (limits: %d per peer, %d in all), %d after n3's transfer; goroutines of the test process: %d before, %d during (both ends)",
		held, DefaultLimits.MaxStreamsPerPeer, DefaultLimits.MaxStreams, after, goroutines, during)
	t.Logf("n3's transfer of 32 MiB of data: %v alone, %v during the flood", alone.Round(time.Millisecond), flooded3.Round(time.Millisecond))
	if accepted != DefaultLimits.MaxStreamsPerPeer || refused[codes.ResourceExhausted] != streams-accepted {
		t.Errorf("%d accepted, refused %v; want %d accepted and the rest ResourceExhausted", accepted, refused, DefaultLimits.MaxStreamsPerPeer)
	}
	if held > DefaultLimits.MaxStreamsPerPeer {
		t.Errorf("the server holds %d streams of one peer", held)
	}
}
