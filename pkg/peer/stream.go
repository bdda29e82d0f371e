package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
)

// A stream sends only the allocated extents of its source (SEEK_DATA and
// SEEK_HOLE), and of those only the blocks that are not all zeros: the
// receiver's file starts sparse, so holes stay holes. Each frame of data
// has its CRC-32C; the end frame has the count of data bytes and a SHA-256
// over every frame of data (offset, length, data) in order, so that a
// frame lost, repeated or moved fails as surely as a flipped bit.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// zeroBlock is the unit in which all-zero data is left out.
const zeroBlock = 4096

// digest is the whole-stream digest both ends compute.
type digest struct{ h hash.Hash }

func newDigest() digest { return digest{h: sha256.New()} }

func (d digest) add(off int64, data []byte) {
	var hdr [16]byte
	binary.BigEndian.PutUint64(hdr[:8], uint64(off))
	binary.BigEndian.PutUint64(hdr[8:], uint64(len(data)))
	d.h.Write(hdr[:])
	d.h.Write(data)
}

func (d digest) sum() (s [32]byte) {
	copy(s[:], d.h.Sum(nil))
	return s
}

// send streams the data of f (size bytes) through emit, paced by pace.
func send(ctx context.Context, f *os.File, size int64, pace Pacer, emit func(*Frame) error) error {
	alloc, err := filecopy.AllocatedBytes(f)
	if err != nil {
		return err
	}
	extents, err := filecopy.DataExtents(f, size)
	if err != nil {
		return err
	}
	if err := emit(&Frame{Type: FrameHeader, Size: size, Alloc: min(alloc, size)}); err != nil {
		return err
	}
	d := newDigest()
	var sent int64
	buf := make([]byte, MaxChunk)
	for _, e := range extents {
		for off := e[0]; off < e[1]; {
			n := int(min(e[1]-off, MaxChunk))
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				return fmt.Errorf("read at %d: %w", off, err)
			}
			runs := nonZeroRuns(buf[:n])
			if len(runs) == 0 {
				// Nothing to send, but a pause holds the reads too.
				if err := pace.Wait(ctx, 0); err != nil {
					return err
				}
			}
			for _, r := range runs {
				data := buf[r[0]:r[1]]
				at := off + int64(r[0])
				d.add(at, data)
				if err := emit(&Frame{Type: FrameData, Offset: at, CRC: crc32.Checksum(data, castagnoli), Data: data}); err != nil {
					return err
				}
				sent += int64(len(data))
				if err := pace.Wait(ctx, len(data)); err != nil {
					return err
				}
			}
			off += int64(n)
		}
	}
	return emit(&Frame{Type: FrameEnd, Bytes: sent, Digest: d.sum()})
}

// nonZeroRuns returns the [from, to) ranges of b's zeroBlock-sized blocks
// that are not all zeros, adjacent ones merged.
func nonZeroRuns(b []byte) [][2]int {
	var runs [][2]int
	zero := make([]byte, zeroBlock)
	for i := 0; i < len(b); i += zeroBlock {
		j := min(i+zeroBlock, len(b))
		if bytes.Equal(b[i:j], zero[:j-i]) {
			continue
		}
		if n := len(runs); n > 0 && runs[n-1][1] == i {
			runs[n-1][1] = j
		} else {
			runs = append(runs, [2]int{i, j})
		}
	}
	return runs
}

// Pacer paces the data a node sends in a stream: Wait is told the data
// bytes of each frame just sent (0 for a chunk of zeros left out) and
// returns when the stream may go on; Close is called when the stream ends.
type Pacer interface {
	Wait(ctx context.Context, n int) error
	Close()
}

// SourcePacer is implemented by Handlers that pace the streams they serve
// themselves: by what a stream costs their node as well as by the rate
// the request asks (rate, 0 for none). Other Handlers' streams are held
// to that rate alone.
type SourcePacer interface {
	PaceSource(req *ReadRequest, rate int64) Pacer
}

// pacer holds a sender to a rate of bytes per second.
type pacer struct {
	rate  int64
	start time.Time
	sent  int64
}

func (p *pacer) Close() {}

// Wait records n bytes sent and sleeps until the rate allows them.
func (p *pacer) Wait(ctx context.Context, n int) error {
	p.sent += int64(n)
	if p.rate <= 0 {
		return ctx.Err()
	}
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	d := time.Until(due)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sink takes the data a stream brings.
type Sink interface {
	// Start is called with the source's size and allocated bytes (the
	// most data to come) before any data; it returns where the data
	// goes.
	Start(size, alloc int64) (io.WriterAt, error)
	// Progress is called after each frame of data with the data bytes
	// written so far.
	Progress(written int64)
}

// Received sums up a verified stream.
type Received struct {
	Size  int64 // the source's size
	Bytes int64 // data bytes received (the rest were holes or zeros)
}

// receive reads a stream with next and writes its data to sink, checking
// every frame and the end. A frame out of order or out of bounds, a
// checksum that does not match, or a stream that ends without its end
// frame is DataLoss; the sink's refusal of the source comes back as it is.
func receive(next func(*Frame) error, sink Sink) (Received, error) {
	var got Received
	var hdr Frame
	for hdr.Type == 0 || hdr.Type == FrameWait {
		if err := next(&hdr); err != nil {
			if errors.Is(err, io.EOF) {
				return got, corrupt("stream ended before its header")
			}
			return got, err
		}
	}
	if hdr.Type != FrameHeader || hdr.Size <= 0 {
		return got, corrupt("first frame %q of size %d, want a header with a positive size", hdr.Type, hdr.Size)
	}
	got.Size = hdr.Size
	w, err := sink.Start(hdr.Size, hdr.Alloc)
	if err != nil {
		return got, err
	}
	d := newDigest()
	var next0 int64 // the first offset the next frame may have
	var f Frame     // one for all: each frame's data is decoded into its buffer
	for {
		if err := next(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return got, corrupt("stream ended after %d bytes without its end frame", got.Bytes)
			}
			return got, err
		}
		switch f.Type {
		case FrameData:
			// Offset is not negative (decoding checks), but Offset+len
			// may overflow: compare against the size less the length.
			if f.Offset < next0 || f.Offset > got.Size-int64(len(f.Data)) {
				return got, corrupt("data frame of %d bytes at %d out of order or beyond the size %d", len(f.Data), f.Offset, got.Size)
			}
			if c := crc32.Checksum(f.Data, castagnoli); c != f.CRC {
				return got, corrupt("data frame at %d: CRC-32C %08x, frame says %08x", f.Offset, c, f.CRC)
			}
			if _, err := w.WriteAt(f.Data, f.Offset); err != nil {
				return got, fmt.Errorf("write at %d: %w", f.Offset, err)
			}
			d.add(f.Offset, f.Data)
			got.Bytes += int64(len(f.Data))
			next0 = f.Offset + int64(len(f.Data))
			sink.Progress(got.Bytes)
		case FrameEnd:
			if f.Bytes != got.Bytes || f.Digest != d.sum() {
				return got, corrupt("end of stream: %d bytes and digest %x, the sender's %d and %x", got.Bytes, d.sum(), f.Bytes, f.Digest)
			}
			if err := next(new(Frame)); !errors.Is(err, io.EOF) {
				if err == nil {
					return got, corrupt("frames after the end")
				}
				return got, err
			}
			return got, nil
		default:
			return got, corrupt("unexpected frame %q", f.Type)
		}
	}
}

func corrupt(format string, args ...any) error {
	return status.Errorf(codes.DataLoss, "corrupt data stream: %s", fmt.Sprintf(format, args...))
}

// waitEvery is how often the sender says it is still there while it
// prepares the source (a copy of a volume where the filesystem cannot
// reflink takes as long as the data takes to copy), so that the receiver
// can cut a stream that brings nothing for a while without cutting a slow
// source.
var waitEvery = 10 * time.Second

// readData serves the stream ReadData within the server's limits: it
// takes a place among the streams of the calling node and of this node
// (ResourceExhausted when either is full), decodes the request, lets the
// Handler open the source (sending wait frames meanwhile), and sends it at
// no less than the least rate, within the deadline of its size at that
// rate and streamSlack (DeadlineExceeded past it).
func readData(srv any, ss grpc.ServerStream) error {
	svc := srv.(*service)
	ctx := ss.Context()
	if svc.lim.RefuseData {
		return status.Error(codes.PermissionDenied, "this node's plugin serves no data to peers (--peer-serve-data=false): restore or clone its snapshots and volumes on this node")
	}
	caller, _ := Caller(ctx)
	release, err := svc.streams.admit(caller.Node)
	if err != nil {
		return err
	}
	defer release()
	req := new(ReadRequest)
	if err := ss.RecvMsg(req); err != nil {
		return status.Errorf(codes.InvalidArgument, "read request: %v", err)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	req.Claim = first(md, mdClaim)
	f, size, err := svc.open(ss, req)
	if err != nil {
		return err
	}
	rate := req.Rate
	if rate > 0 && rate < svc.lim.MinRate {
		rate = svc.lim.MinRate
	}
	limit := svc.lim.streamDeadline(size)
	sendCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// The stream's goroutine sends and then lets the file go. A
	// receiver that stops reading holds SendMsg until the stream ends:
	// past the deadline this handler returns, gRPC ends the stream, and
	// that releases the goroutine.
	sent := make(chan error, 1)
	go func() {
		err := safely(ctx, "send", req.ID, func() error {
			pace := svc.pacer(req, rate)
			defer pace.Close()
			return send(sendCtx, f, size, pace, func(fr *Frame) error { return ss.SendMsg(fr) })
		})
		svc.finish(ctx, req, f, err)
		sent <- err
	}()
	select {
	case err := <-sent:
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			break
		}
		return err
	case <-sendCtx.Done():
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	klog.InfoS("data stream cut at its deadline", "volumeID", req.ID, "peer", caller.Node, "size", size, "deadline", limit)
	return status.Errorf(codes.DeadlineExceeded, "stream of %s %s (%d bytes) to node %s: longer than its deadline %v (its size at the least rate, %d bytes/s, and %v)",
		req.Kind, req.ID, size, caller.Node, limit, svc.lim.MinRate, streamSlack)
}

// pacer is how the stream of req is paced: by the Handler if it paces
// streams (SourcePacer), else by the rate alone.
func (svc *service) pacer(req *ReadRequest, rate int64) Pacer {
	if sp, ok := svc.Handler.(SourcePacer); ok {
		return sp.PaceSource(req, rate)
	}
	return &pacer{rate: rate, start: time.Now()}
}

// open lets the Handler open the source req names, sending a wait frame
// every waitEvery meanwhile.
func (svc *service) open(ss grpc.ServerStream, req *ReadRequest) (*os.File, int64, error) {
	type source struct {
		f    *os.File
		size int64
		err  error
	}
	opened := make(chan source, 1)
	go func() {
		var src source
		src.err = safely(ss.Context(), "open", req.ID, func() (err error) {
			src.f, src.size, err = svc.OpenSource(ss.Context(), req)
			return err
		})
		opened <- src
	}()
	tick := time.NewTicker(waitEvery)
	defer tick.Stop()
	for {
		select {
		case src := <-opened:
			return src.f, src.size, src.err
		case <-tick.C:
			if err := ss.SendMsg(&Frame{Type: FrameWait}); err != nil {
				// The receiver is gone: its context ends the opening.
				if src := <-opened; src.err == nil {
					svc.finish(ss.Context(), req, src.f, err)
				}
				return nil, 0, err
			}
		}
	}
}

// finish closes the file of a stream that ended with err and tells the
// Handler, if it asks (SourceFinisher).
func (svc *service) finish(ctx context.Context, req *ReadRequest, f *os.File, err error) {
	f.Close()
	if fin, ok := svc.Handler.(SourceFinisher); ok {
		fin.SourceSent(ctx, req, err)
	}
}
