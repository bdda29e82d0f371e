package peer

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// setVar sets *p to v for the test.
func setVar[T any](t *testing.T, p *T, v T) {
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// closedWithin reports whether the server closes conn within d, the
// test's side saying nothing.
func closedWithin(conn net.Conn, d time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(d))
	_, err := conn.Read(make([]byte, 1))
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestHandshakeTimeout: a connection that never starts its TLS handshake
// is closed after the handshake timeout, not gRPC's 120 s.
func TestHandshakeTimeout(t *testing.T) {
	setVar(t, &handshakeTimeout, 300*time.Millisecond)
	addr := serve(t, newCreds(t, newCA(t), n1), &recorder{})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if !closedWithin(conn, 5*time.Second) {
		t.Errorf("a silent connection still open after %v", time.Since(start))
	}
}

// TestConnsPerAddr: an address with MaxConnsPerAddr connections open has
// the next closed at once; a closed one frees its place.
func TestConnsPerAddr(t *testing.T) {
	addr, _ := serveWithin(t, newCreds(t, newCA(t), n1), &recorder{}, Limits{MaxConnsPerAddr: 3})
	var conns []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns[:3] {
		if closedWithin(c, 200*time.Millisecond) {
			t.Errorf("connection %d of 3 closed", i)
		}
	}
	if !closedWithin(conns[3], 5*time.Second) {
		t.Error("the fourth connection of the address is open")
	}
	conns[0].Close()
	waitFor(t, "connection accepted after one closed", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if closedWithin(c, 300*time.Millisecond) {
			c.Close()
			return false
		}
		t.Cleanup(func() { c.Close() })
		return true
	})
}

// grpcConn is a raw connection of id's client to the peer at addr.
func grpcConn(t *testing.T, ca *CA, id Identity, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(newCreds(t, ca, id).ClientConfig("n1"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestIdleConnectionClosed: the server closes a connection without calls.
func TestIdleConnectionClosed(t *testing.T) {
	setVar(t, &idleConnection, 300*time.Millisecond)
	ca := newCA(t)
	addr := serve(t, newCreds(t, ca, n1), &recorder{})
	conn := grpcConn(t, ca, n2, addr)
	if err := conn.Invoke(callCtx(t), methodExpand, &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1"}, new(csi.ControllerExpandVolumeResponse)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn.GetState() == connectivity.Ready && !conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Error("an idle connection still open after 5 s")
	}
}

// concurrency is a Handler whose ExpandVolume waits for its call's end,
// counting the calls at once.
type concurrency struct {
	recorder
	now, most atomic.Int32
}

func (c *concurrency) ExpandVolume(ctx context.Context, _ *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStreamsPerConn: one connection has at most maxStreamsPerConn calls
// served at once.
func TestStreamsPerConn(t *testing.T) {
	ca := newCA(t)
	h := &concurrency{}
	addr := serve(t, newCreds(t, ca, n1), h)
	conn := grpcConn(t, ca, n2, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < maxStreamsPerConn+8; i++ {
		wg.Go(func() {
			conn.Invoke(ctx, methodExpand, &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1"}, new(csi.ControllerExpandVolumeResponse))
		})
	}
	wg.Wait()
	if m := h.most.Load(); m == 0 || m > maxStreamsPerConn {
		t.Errorf("%d calls of one connection served at once, want 1 to %d", m, maxStreamsPerConn)
	}
}

// rawStream opens a data stream of req on conn and reads its first frame,
// leaving the rest to the caller.
func rawStream(ctx context.Context, conn *grpc.ClientConn, req *ReadRequest) (grpc.ClientStream, error) {
	st, err := conn.NewStream(ctx, &serviceDesc.Streams[0], methodReadData, grpc.CallContentSubtype(xferCodec), grpc.MaxCallRecvMsgSize(maxFrame))
	if err == nil {
		err = st.SendMsg(req)
	}
	if err == nil {
		err = st.CloseSend()
	}
	if err == nil {
		err = st.RecvMsg(new(Frame))
	}
	return st, err
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s after 5 s", what)
		}
	}
}

// TestReadDataStreamLimits: beyond MaxStreamsPerPeer streams of one node,
// or MaxStreams in all, a stream is ResourceExhausted naming the limit;
// an ended stream frees its place.
func TestReadDataStreamLimits(t *testing.T) {
	ca := newCA(t)
	addr, srv := serveWithin(t, newCreds(t, ca, n1), &recorder{block: true}, Limits{MaxStreams: 3, MaxStreamsPerPeer: 2})
	client := func(id Identity) *Client {
		return NewClient(newCreds(t, ca, id), Static{"n1": {Node: "n1", Addr: addr}})
	}
	c2, c3 := client(n2), client(n3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	hold := func(c *Client, want int) {
		wg.Go(func() {
			c.ReadData(ctx, "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), time.Minute)
		})
		waitFor(t, "stream held", func() bool { return srv.Streams() == want })
	}
	hold(c2, 1)
	hold(c2, 2)
	read := func(c *Client) error {
		_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), time.Minute)
		return err
	}
	if err := read(c2); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--peer-max-streams-per-peer") {
		t.Errorf("third stream of n2: %v, want ResourceExhausted naming the limit per peer", err)
	}
	hold(c3, 3)
	if err := read(c3); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--peer-max-streams)") {
		t.Errorf("fourth stream on n1: %v, want ResourceExhausted naming the limit of the node", err)
	}
	cancel()
	waitFor(t, "stream released", func() bool { return srv.Streams() == 0 })
}

// TestReadDataMinRate: a stream asked at 1 byte per second is sent at the
// server's least rate.
func TestReadDataMinRate(t *testing.T) {
	src, _ := sparseSource(t, 4<<20, [][2]int64{{0, 2 << 20}})
	ca := newCA(t)
	addr, _ := serveWithin(t, newCreds(t, ca, n1), &recorder{files: map[string]string{"s1-n1": src}}, Limits{MinRate: 8 << 20})
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	start := time.Now()
	if _, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1", Rate: 1}, newFileSink(t), time.Minute); err != nil {
		t.Fatalf("ReadData at 1 B/s: %v after %v", err, time.Since(start))
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("2 MiB at 8 MiB/s took %v", took)
	}
}

// TestReadDataDeadline: a receiver that stops reading does not hold its
// stream past the source's size at the least rate and the slack: the
// stream's place is free at once, and the receiver then reads
// DeadlineExceeded.
func TestReadDataDeadline(t *testing.T) {
	setVar(t, &streamSlack, 300*time.Millisecond)
	src, _ := sparseSource(t, 16<<20, [][2]int64{{0, 16 << 20}})
	ca := newCA(t)
	addr, srv := serveWithin(t, newCreds(t, ca, n1), &recorder{files: map[string]string{"s1-n1": src}}, Limits{MinRate: 64 << 20})
	st, err := rawStream(callCtx(t), grpcConn(t, ca, n2, addr), &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "stream released while its receiver reads nothing", func() bool { return srv.Streams() == 0 })
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("stream released after %v, before its deadline", took)
	}
	for {
		if err = st.RecvMsg(new(Frame)); err != nil {
			break
		}
	}
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("stream not read: %v, want DeadlineExceeded", err)
	}
}

// TestPanicsEndTheCall: a panic in a unary call, in the opening of a
// stream's source or in its sending goroutine ends that call with
// Internal; the server serves on.
func TestPanicsEndTheCall(t *testing.T) {
	src, _ := sparseSource(t, 1<<20, [][2]int64{{0, 4096}})
	ca := newCA(t)
	h := &recorder{files: map[string]string{"s1-n1": src}, panic: true}
	panicky := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &tamperedStream{ServerStream: ss, change: func(int, *Frame) bool { panic("a bug in sending") }})
	})
	addr := serve(t, newCreds(t, ca, n1), h, panicky)
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	if _, err := c.ExpandVolume(callCtx(t), "n1", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1"}); status.Code(err) != codes.Internal {
		t.Errorf("ExpandVolume that panics: %v, want Internal", err)
	}
	read := func() error {
		_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), time.Minute)
		return err
	}
	if err := read(); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "s1-n1") {
		t.Errorf("ReadData whose source panics: %v, want Internal naming the source", err)
	}
	h.mu.Lock()
	h.panic = false
	h.mu.Unlock()
	if err := read(); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panic") {
		t.Errorf("ReadData whose sending panics: %v, want Internal", err)
	}
}

// TestRefuseData: with data off, a stream is PermissionDenied and
// forwarded calls are served.
func TestRefuseData(t *testing.T) {
	ca := newCA(t)
	addr, _ := serveWithin(t, newCreds(t, ca, n1), &recorder{}, Limits{RefuseData: true})
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), time.Minute)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--peer-serve-data") {
		t.Errorf("ReadData with data off: %v, want PermissionDenied", err)
	}
	if _, err := c.ExpandVolume(callCtx(t), "n1", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1"}); err != nil {
		t.Errorf("ExpandVolume with data off: %v", err)
	}
}
