package peer

import (
	"bytes"
	"context"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testfs"
)

// sparseSource writes a file of size bytes with data at each [offset,
// length) of extents (holes elsewhere) and one all-zero written block, and
// returns its path and the data bytes that must travel.
func sparseSource(t testing.TB, size int64, extents [][2]int64) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "source")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	var data int64
	for i, e := range extents {
		testfs.WriteAt(t, path, e[0], int(e[1]), byte(i+1))
		data += e[1]
	}
	// Written zeros are allocated, but need not travel.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, zeroBlock), size-zeroBlock); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// fileSink writes a stream into a new sparse file.
type fileSink struct {
	t        testing.TB
	path     string
	f        *os.File
	size     int64
	progress atomic.Int64
}

func newFileSink(t testing.TB) *fileSink {
	return &fileSink{t: t, path: filepath.Join(t.TempDir(), "target")}
}

func (s *fileSink) Start(size, _ int64) (io.WriterAt, error) {
	f, err := os.Create(s.path)
	if err != nil {
		return nil, err
	}
	s.t.Cleanup(func() { f.Close() })
	s.f, s.size = f, size
	return f, f.Truncate(size)
}

func (s *fileSink) Progress(n int64) { s.progress.Store(n) }

// streamPeers serves src as "s1-n1" from n1 (with opts) and returns n2's
// client of it.
func streamPeers(t *testing.T, src string, opts ...grpc.ServerOption) (*Client, *recorder) {
	ca := newCA(t)
	h := &recorder{files: map[string]string{"s1-n1": src}}
	addr := serve(t, newCreds(t, ca, n1), h, opts...)
	return NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}}), h
}

// TestReadData: a stream over mutual TLS brings the source's data exactly,
// sends only its allocated, non-zero blocks (the received file takes no
// more disk than the source: holes stay holes), and reports its progress.
func TestReadData(t *testing.T) {
	const size = 64 << 20
	src, data := sparseSource(t, size, [][2]int64{{0, 4096}, {1 << 20, 3<<20 + 512}, {40 << 20, 8 << 20}})
	c, h := streamPeers(t, src)
	sink := newFileSink(t)
	got, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1", Target: "pvc-x"}, sink, time.Minute)
	if err != nil {
		t.Fatalf("ReadData: %v", err)
	}
	// The extent of 3 MiB + 512 bytes travels in whole blocks.
	if want := data + zeroBlock - 512; got.Size != size || got.Bytes != want || sink.progress.Load() != want {
		t.Errorf("received %+v, progress %d; want size %d and %d data bytes", got, sink.progress.Load(), size, want)
	}
	testfs.SamePrefix(t, src, sink.path)
	if b, sb := testfs.Allocated(t, sink.path), testfs.Allocated(t, src); b > sb || b > data+1<<20 {
		t.Errorf("the copy takes %d bytes of disk, the source %d for %d bytes of data: holes were filled", b, sb, data)
	}
	if r, ok := h.calls[0].(*ReadRequest); !ok || r.Target != "pvc-x" || h.callers[0] != n2 {
		t.Errorf("the peer got %+v from %v", h.calls[0], h.callers[0])
	}
}

// TestReadDataRate: the sender keeps to the rate asked for.
func TestReadDataRate(t *testing.T) {
	src, _ := sparseSource(t, 8<<20, [][2]int64{{0, 4 << 20}})
	c, _ := streamPeers(t, src)
	start := time.Now()
	if _, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1", Rate: 4 << 20}, newFileSink(t), time.Minute); err != nil {
		t.Fatal(err)
	}
	// 4 MiB and a block at 4 MiB/s: the last chunk is due after 1 s.
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("4 MiB at 4 MiB/s took %v", took)
	}
}

// pacingRecorder is a recorder that paces its streams itself
// (SourcePacer): its Pacer holds the stream after the first frame of data
// until release is closed, and counts what it is told.
type pacingRecorder struct {
	*recorder
	rate    atomic.Int64
	data    atomic.Int64 // data bytes Wait was told of
	zeros   atomic.Int64 // Wait(0) calls: chunks of zeros left out
	waits   atomic.Int64
	closed  atomic.Int64
	release chan struct{}
}

func (r *pacingRecorder) PaceSource(_ *ReadRequest, rate int64) Pacer {
	r.rate.Store(rate)
	return r
}

func (r *pacingRecorder) Wait(ctx context.Context, n int) error {
	r.data.Add(int64(n))
	if n == 0 {
		r.zeros.Add(1)
	}
	if r.waits.Add(1) == 1 {
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *pacingRecorder) Close() { r.closed.Add(1) }

// TestReadDataPacedBySource: a Handler that paces its streams gets the
// rate the request asks, and its Pacer holds the stream: nothing more
// arrives while it waits after the first frame, all of it once it lets
// go; it is told every data byte sent (and of each chunk of zeros left
// out) and closed once, at the stream's end.
func TestReadDataPacedBySource(t *testing.T) {
	src, _ := sparseSource(t, 8<<20, [][2]int64{{0, 3 << 20}, {6 << 20, 1 << 20}})
	// A chunk of written zeros: read, and left out.
	f, err := os.OpenFile(src, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, MaxChunk), 4<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ca := newCA(t)
	h := &pacingRecorder{recorder: &recorder{files: map[string]string{"s1-n1": src}}, release: make(chan struct{})}
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: serve(t, newCreds(t, ca, n1), h)}})
	sink := newFileSink(t)
	type result struct {
		got Received
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1", Rate: 7 << 20}, sink, time.Minute)
		done <- result{got, err}
	}()
	for h.waits.Load() == 0 {
		select {
		case r := <-done:
			t.Fatalf("the stream ended (%+v, %v) without the Handler's Pacer", r.got, r.err)
		case <-time.After(time.Millisecond):
		}
	}
	time.Sleep(100 * time.Millisecond) // time for more frames, if the Pacer did not hold them
	if p := sink.progress.Load(); p > MaxChunk {
		t.Errorf("%d bytes arrived while the Pacer held the stream after its first frame", p)
	}
	close(h.release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	testfs.SamePrefix(t, src, sink.path)
	if h.rate.Load() != 7<<20 || h.data.Load() != r.got.Bytes || h.zeros.Load() == 0 || h.closed.Load() != 1 {
		t.Errorf("pacer: rate %d, told of %d data bytes (%d received), %d chunks of zeros, closed %d times; want 7 MiB/s, all, some, once",
			h.rate.Load(), h.data.Load(), r.got.Bytes, h.zeros.Load(), h.closed.Load())
	}
}

// tamper is a stream interceptor of the server that changes the frames
// of data it sends after the sender has checksummed them: what a fault
// between the source's disk and the receiver would do.
func tamper(change func(n int, f *Frame) bool) grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &tamperedStream{ServerStream: ss, change: change})
	})
}

type tamperedStream struct {
	grpc.ServerStream
	change func(n int, f *Frame) bool
	n      int
}

func (s *tamperedStream) SendMsg(m any) error {
	if f, ok := m.(*Frame); ok && f.Type == FrameData {
		s.n++
		c := *f
		c.Data = append([]byte(nil), f.Data...)
		if !s.change(s.n, &c) {
			return nil // dropped
		}
		m = &c
	}
	return s.ServerStream.SendMsg(m)
}

// TestReadDataCorrupt: a flipped bit, a frame lost, frames out of order
// or out of bounds each fail the stream with DataLoss.
func TestReadDataCorrupt(t *testing.T) {
	src, _ := sparseSource(t, 16<<20, [][2]int64{{0, 6 << 20}})
	for name, change := range map[string]func(int, *Frame) bool{
		"bit flipped":  func(n int, f *Frame) bool { f.Data[100] ^= 1 << (n % 8); return true },
		"frame lost":   func(n int, _ *Frame) bool { return n != 3 },
		"out of order": func(n int, f *Frame) bool { f.Offset -= int64(n/3) * MaxChunk; return true },
		"out of range": func(n int, f *Frame) bool { f.Offset += int64(n/3) * 16 << 20; return true },
		"moved":        func(n int, f *Frame) bool { f.Offset += int64(n/3) * zeroBlock; return true },
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := streamPeers(t, src, tamper(change))
			_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), time.Minute)
			if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "corrupt data stream") {
				t.Errorf("ReadData: %v, want DataLoss", err)
			}
		})
	}
}

// TestReadDataIdle: a peer that sends nothing is cut after the idle time,
// Unavailable; and one that is not there is Unavailable at once.
func TestReadDataIdle(t *testing.T) {
	ca := newCA(t)
	addr := serve(t, newCreds(t, ca, n1), &recorder{block: true})
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	start := time.Now()
	_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, newFileSink(t), 300*time.Millisecond)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "sent nothing") || time.Since(start) > 5*time.Second {
		t.Errorf("ReadData from a silent peer: %v after %v, want Unavailable soon after 300ms", err, time.Since(start))
	}
	_, err = c.ReadData(callCtx(t), "n3", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n3"}, newFileSink(t), time.Minute)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ReadData from an unknown node: %v, want Unavailable", err)
	}
}

// TestReadDataSlowSource: a source that takes longer to prepare than the
// idle cut (a copy of a volume) keeps its stream with wait frames.
func TestReadDataSlowSource(t *testing.T) {
	defer func(w time.Duration) { waitEvery = w }(waitEvery)
	waitEvery = 50 * time.Millisecond
	src, _ := sparseSource(t, 1<<20, [][2]int64{{0, 4096}})
	ca := newCA(t)
	addr := serve(t, newCreds(t, ca, n1), &recorder{files: map[string]string{"s1-n1": src}, delay: time.Second})
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	sink := newFileSink(t)
	if _, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n1"}, sink, 300*time.Millisecond); err != nil {
		t.Fatalf("ReadData of a source slower than the idle cut: %v", err)
	}
	testfs.SamePrefix(t, src, sink.path)
}

// TestReadDataSourceRefused: the peer's refusal comes back as it gave it.
func TestReadDataSourceRefused(t *testing.T) {
	src, _ := sparseSource(t, 1<<20, nil)
	c, _ := streamPeers(t, src)
	_, err := c.ReadData(callCtx(t), "n1", &ReadRequest{Kind: SourceSnapshot, ID: "../etc/passwd-n1"}, newFileSink(t), time.Minute)
	if status.Code(err) != codes.NotFound {
		t.Errorf("ReadData of an unknown source: %v, want the peer's NotFound", err)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Type: FrameWait},
		{Type: FrameHeader, Size: 1 << 30, Alloc: 4096},
		{Type: FrameData, Offset: 8192, CRC: 0xdeadbeef, Data: []byte("data")},
		{Type: FrameEnd, Bytes: 4, Digest: [32]byte{1, 2, 3}},
	} {
		b, err := f.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var g Frame
		if err := g.UnmarshalBinary(b); err != nil || g.Type != f.Type || g.Size != f.Size || g.Alloc != f.Alloc ||
			g.Offset != f.Offset || g.CRC != f.CRC || !bytes.Equal(g.Data, f.Data) || g.Bytes != f.Bytes || g.Digest != f.Digest {
			t.Errorf("%+v reads back as %+v, %v", f, g, err)
		}
	}
	r := ReadRequest{Kind: SourceVolume, ID: "v1-n1", Target: "pvc-1", Rate: 200 << 20}
	b, _ := r.MarshalBinary()
	var g ReadRequest
	if err := g.UnmarshalBinary(b); err != nil || g != r {
		t.Errorf("%+v reads back as %+v, %v", r, g, err)
	}
}

// TestCodecReusesMemory: the stream's codec decodes each frame into the
// receiving Frame's own buffer and encodes a frame of data into a buffer
// of gRPC's pool, given back when gRPC frees it: a megabyte a frame is
// neither allocated on receiving nor on sending, and what comes out is
// what went in.
func TestCodecReusesMemory(t *testing.T) {
	data := bytes.Repeat([]byte{7, 1, 2}, MaxChunk/3)
	in := &Frame{Type: FrameData, Offset: 1 << 20, CRC: crc32.Checksum(data, castagnoli), Data: data}
	var c codec
	var out Frame
	sent, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	defer sent.Free()
	decode := func() {
		if err := c.Unmarshal(sent, &out); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip := func() {
		b, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Unmarshal(b, &out)
		b.Free()
		if err != nil {
			t.Fatal(err)
		}
	}
	roundTrip()
	if out.Type != FrameData || out.Offset != in.Offset || out.CRC != in.CRC || !bytes.Equal(out.Data, data) {
		t.Fatalf("decoded %v at %d (crc %x, %d bytes), want the frame sent", out.Type, out.Offset, out.CRC, len(out.Data))
	}
	allocated := func(f func()) uint64 {
		const n = 50
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			f()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	if per := allocated(decode); per > 64<<10 {
		t.Errorf("%d bytes allocated per frame of %d bytes received", per, len(data))
	}
	// The race detector makes sync.Pool drop some of what it is given
	// back, on purpose: the sending side is counted without it.
	if !raceEnabled {
		if per := allocated(roundTrip); per > 64<<10 {
			t.Errorf("%d bytes allocated per frame of %d bytes sent and received", per, len(data))
		}
	}
	if !bytes.Equal(out.Data, data) {
		t.Error("the last frame decoded differs from the one sent")
	}
}

// boundedSink records writes and fails the test on any outside [0, size).
type boundedSink struct {
	t    *testing.T
	size int64
}

func (s *boundedSink) Start(size, _ int64) (io.WriterAt, error) {
	if size > 1<<40 {
		return nil, status.Error(codes.OutOfRange, "too large")
	}
	s.size = size
	return s, nil
}

func (s *boundedSink) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off > s.size-int64(len(p)) || len(p) > MaxChunk {
		s.t.Fatalf("write of %d bytes at %d, outside [0, %d)", len(p), off, s.size)
	}
	return len(p), nil
}

func (s *boundedSink) Progress(int64) {}

// FuzzStream: whatever a peer sends is decoded by the stream's codec
// alone. A request or frame that decodes encodes to the same bytes; a
// sequence of frames (each prefixed by a 3-byte length) is either
// accepted, every write inside the announced size, or refused, never a
// panic.
func FuzzStream(f *testing.F) {
	enc := func(fs ...Frame) []byte {
		var out []byte
		for _, fr := range fs {
			b, _ := fr.MarshalBinary()
			out = append(out, byte(len(b)>>16), byte(len(b)>>8), byte(len(b)))
			out = append(out, b...)
		}
		return out
	}
	d := newDigest()
	d.add(4096, []byte("abcd"))
	crc := crc32.Checksum([]byte("abcd"), castagnoli)
	f.Add(enc(Frame{Type: FrameWait}, Frame{Type: FrameHeader, Size: 8192}, Frame{Type: FrameData, Offset: 4096, CRC: crc, Data: []byte("abcd")},
		Frame{Type: FrameEnd, Bytes: 4, Digest: d.sum()}))
	f.Add(enc(Frame{Type: FrameHeader, Size: 4096}, Frame{Type: FrameData, Offset: 4094, CRC: crc, Data: []byte("abcd")}))
	f.Add(enc(Frame{Type: FrameHeader, Size: 8192}, Frame{Type: FrameData, Offset: 1<<63 - 2, CRC: crc, Data: []byte("abcd")}))
	req, _ := (&ReadRequest{Kind: SourceSnapshot, ID: "../../etc/passwd-n1", Target: "x"}).MarshalBinary()
	f.Add(req)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r ReadRequest
		if r.UnmarshalBinary(b) == nil {
			back, err := r.MarshalBinary()
			if err != nil || !bytes.Equal(back, b) {
				t.Fatalf("request %+v from %x encodes as %x, %v", r, b, back, err)
			}
		}
		var fr Frame
		if fr.UnmarshalBinary(b) == nil {
			back, err := fr.MarshalBinary()
			if err != nil || !bytes.Equal(back, b) {
				t.Fatalf("frame %+v from %x encodes as %x, %v", fr, b, back, err)
			}
		}
		rest := b
		next := func(f *Frame) error {
			if len(rest) < 3 {
				return io.EOF
			}
			n := int(rest[0])<<16 | int(rest[1])<<8 | int(rest[2])
			rest = rest[3:]
			if n > len(rest) {
				return io.EOF
			}
			m := rest[:n]
			rest = rest[n:]
			return f.UnmarshalBinary(m)
		}
		receive(next, &boundedSink{t: t})
	})
}
