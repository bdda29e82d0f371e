package peer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// The data stream (ReadData) carries its own messages, not protobuf: a
// request, then frames of a fixed binary layout that a peer's bytes are
// decoded from with every length checked before it is used. They travel
// with gRPC's content subtype xferCodec, registered here; the unary calls
// keep the proto codec.
//
//	request: version 1 | kind 1 | rate 8 | len(ID) 1 | ID | len(target) 1 | target
//	wait:    'W' (the source is being prepared; only before the header)
//	header:  'H' | size 8 | allocated 8
//	data:    'D' | offset 8 | crc32c 4 | data (the rest of the message)
//	end:     'E' | data bytes 8 | sha256 32
//
// Integers are big-endian. A frame of data holds 1 to MaxChunk bytes.
const (
	xferCodec   = "fastblk-xfer-v1"
	xferVersion = 1

	// MaxChunk is the most data one frame carries.
	MaxChunk = 1 << 20
	// maxFrame bounds every message of the stream: a frame of data and
	// its fields.
	maxFrame = MaxChunk + 64
	// maxIDLen is the CSI limit for IDs and names.
	maxIDLen = 128
)

// SourceKind is what a ReadRequest asks for.
type SourceKind uint8

const (
	// SourceSnapshot is a snapshot of the peer's node, sent as it is.
	SourceSnapshot SourceKind = 1
	// SourceVolume is a volume of the peer's node, of which the peer
	// takes a point-in-time copy to send.
	SourceVolume SourceKind = 2
)

func (k SourceKind) String() string {
	switch k {
	case SourceSnapshot:
		return "snapshot"
	case SourceVolume:
		return "volume"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

// ReadRequest asks a peer for the data of one of its objects.
type ReadRequest struct {
	Kind SourceKind
	// ID is the object's CSI ID, tagged with the peer's node.
	ID string
	// Target names the volume the data is for, for the peer's logs.
	Target string
	// Rate is the most data bytes per second the peer sends (0: no limit).
	Rate int64
	// Claim is the claim the data is for, <namespace>/<name>, by which
	// the peer checks that the caller may read the source. It travels
	// in the call's metadata, not in the request's bytes.
	Claim string
}

// FrameType tells the frames of a stream apart.
type FrameType byte

const (
	FrameWait   FrameType = 'W'
	FrameHeader FrameType = 'H'
	FrameData   FrameType = 'D'
	FrameEnd    FrameType = 'E'
)

// Frame is one message of a data stream: waits while the sender prepares
// the source, a header with the source's size, then frames of data at
// increasing offsets, then an end with the number of data bytes and a
// digest of the whole stream (see digest).
type Frame struct {
	Type   FrameType
	Size   int64    // header: the source's size in bytes
	Alloc  int64    // header: the source's allocated bytes, the most data to come (for progress)
	Offset int64    // data: where Data goes
	CRC    uint32   // data: CRC-32C (Castagnoli) of Data
	Data   []byte   // data
	Bytes  int64    // end: data bytes sent
	Digest [32]byte // end
	// buf is where the codec decodes a frame of data, used again by
	// the next frame decoded into the same Frame (Data is a slice of it).
	buf []byte
}

var errShort = errors.New("message too short")

// MarshalBinary encodes r.
func (r *ReadRequest) MarshalBinary() ([]byte, error) {
	if len(r.ID) > maxIDLen || len(r.Target) > maxIDLen {
		return nil, fmt.Errorf("read request: ID or target longer than %d bytes", maxIDLen)
	}
	b := []byte{xferVersion, byte(r.Kind)}
	b = binary.BigEndian.AppendUint64(b, uint64(r.Rate))
	b = append(append(b, byte(len(r.ID))), r.ID...)
	return append(append(b, byte(len(r.Target))), r.Target...), nil
}

// UnmarshalBinary decodes r from b, which must be exactly one request.
func (r *ReadRequest) UnmarshalBinary(b []byte) error {
	if len(b) < 11 {
		return fmt.Errorf("read request: %w", errShort)
	}
	if b[0] != xferVersion {
		return fmt.Errorf("read request: version %d, want %d", b[0], xferVersion)
	}
	kind, rate := SourceKind(b[1]), int64(binary.BigEndian.Uint64(b[2:10]))
	if kind != SourceSnapshot && kind != SourceVolume {
		return fmt.Errorf("read request: unknown %v", kind)
	}
	if rate < 0 {
		return fmt.Errorf("read request: negative rate")
	}
	id, rest, err := cutString(b[10:])
	if err != nil {
		return fmt.Errorf("read request: ID: %w", err)
	}
	target, rest, err := cutString(rest)
	if err != nil {
		return fmt.Errorf("read request: target: %w", err)
	}
	if len(rest) != 0 {
		return fmt.Errorf("read request: %d bytes after its end", len(rest))
	}
	*r = ReadRequest{Kind: kind, ID: id, Target: target, Rate: rate}
	return nil
}

// cutString reads a string of a one-byte length from b.
func cutString(b []byte) (string, []byte, error) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", nil, errShort
	}
	n := int(b[0])
	if n > maxIDLen {
		return "", nil, fmt.Errorf("longer than %d bytes", maxIDLen)
	}
	return string(b[1 : 1+n]), b[1+n:], nil
}

// MarshalBinary encodes f.
func (f *Frame) MarshalBinary() ([]byte, error) { return f.appendTo(nil) }

// appendTo appends f's encoding to b.
func (f *Frame) appendTo(b []byte) ([]byte, error) {
	b = append(b, byte(f.Type))
	switch f.Type {
	case FrameWait:
		return b, nil
	case FrameHeader:
		b = binary.BigEndian.AppendUint64(b, uint64(f.Size))
		return binary.BigEndian.AppendUint64(b, uint64(f.Alloc)), nil
	case FrameData:
		if len(f.Data) == 0 || len(f.Data) > MaxChunk {
			return nil, fmt.Errorf("data frame of %d bytes, want 1 to %d", len(f.Data), MaxChunk)
		}
		b = binary.BigEndian.AppendUint64(b, uint64(f.Offset))
		b = binary.BigEndian.AppendUint32(b, f.CRC)
		return append(b, f.Data...), nil
	case FrameEnd:
		b = binary.BigEndian.AppendUint64(b, uint64(f.Bytes))
		return append(b, f.Digest[:]...), nil
	}
	return nil, fmt.Errorf("unknown frame type %q", f.Type)
}

// UnmarshalBinary decodes f from b, which must be exactly one frame. Data
// is a copy: b may be reused.
func (f *Frame) UnmarshalBinary(b []byte) error {
	if err := f.decode(b); err != nil {
		return err
	}
	if f.Data != nil {
		f.Data = append([]byte(nil), f.Data...)
	}
	return nil
}

// decode decodes f from b, which must be exactly one frame; Data is a
// slice of b. f.buf is kept.
func (f *Frame) decode(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("frame: %w", errShort)
	}
	var want int
	switch FrameType(b[0]) {
	case FrameWait:
		if len(b) != 1 {
			return fmt.Errorf("frame %q of %d bytes, want 1", b[0], len(b))
		}
		*f = Frame{Type: FrameWait, buf: f.buf}
		return nil
	case FrameHeader:
		want = 1 + 8 + 8
	case FrameData:
		want = 1 + 8 + 4
	case FrameEnd:
		want = 1 + 8 + 32
	default:
		return fmt.Errorf("frame: unknown type %q", b[0])
	}
	if len(b) < want || (FrameType(b[0]) != FrameData && len(b) != want) {
		return fmt.Errorf("frame %q of %d bytes, want %d", b[0], len(b), want)
	}
	*f = Frame{Type: FrameType(b[0]), buf: f.buf}
	n := int64(binary.BigEndian.Uint64(b[1:9]))
	if n < 0 {
		return fmt.Errorf("frame %q: negative field", b[0])
	}
	switch f.Type {
	case FrameHeader:
		f.Size, f.Alloc = n, int64(binary.BigEndian.Uint64(b[9:17]))
		if f.Alloc < 0 {
			return fmt.Errorf("frame %q: negative field", b[0])
		}
	case FrameData:
		data := b[13:]
		if len(data) == 0 || len(data) > MaxChunk {
			return fmt.Errorf("data frame of %d bytes, want 1 to %d", len(data), MaxChunk)
		}
		f.Offset, f.CRC, f.Data = n, binary.BigEndian.Uint32(b[9:13]), data
	case FrameEnd:
		f.Bytes = n
		copy(f.Digest[:], b[9:])
	}
	return nil
}

// codec is gRPC's codec for the stream's messages. It works on gRPC's
// buffers (encoding.CodecV2) so that a frame of data is copied once on each
// side, into memory used again rather than a new megabyte each time (whose
// pages the kernel must fault in and zero): on sending, a buffer of gRPC's
// pool, which gRPC gives back once it has written it; on receiving, the
// Frame's own buffer, which the next frame decoded into it reuses.
type codec struct{}

func (codec) Name() string { return xferCodec }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *ReadRequest:
		b, err := m.MarshalBinary()
		return mem.BufferSlice{mem.SliceBuffer(b)}, err
	case *Frame:
		pool := mem.DefaultBufferPool()
		buf := pool.Get(13 + len(m.Data) + len(m.Digest))
		b, err := m.appendTo((*buf)[:0])
		if err != nil {
			pool.Put(buf)
			return nil, err
		}
		*buf = b
		return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
	}
	return nil, fmt.Errorf("%s codec: cannot encode %T", xferCodec, v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *ReadRequest:
		return m.UnmarshalBinary(data.Materialize())
	case *Frame:
		n := data.Len()
		if n > maxFrame {
			return fmt.Errorf("frame of %d bytes, more than %d", n, maxFrame)
		}
		if cap(m.buf) < n {
			m.buf = make([]byte, n)
		}
		b := m.buf[:n]
		data.CopyTo(b)
		return m.decode(b)
	}
	return fmt.Errorf("%s codec: cannot decode %T", xferCodec, v)
}

func init() { encoding.RegisterCodecV2(codec{}) }
