package dataplane

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// hostLoop builds a queue on a server thread's state, run on the test's
// own locked thread: a real ring whose queue files are a scratch file, with
// a descriptor array in ordinary memory that the test fills in place of the
// kernel. It exercises the dispatch path on any kernel with io_uring: the
// backing I/O is real, the ublk commands fail (a regular file has no
// uring_cmd) and are reaped by the test. The queue sits in slot 1 of the
// thread, so that user data and table slots are not all zero.
func hostLoop(t testing.TB, depth uint16, kind TargetKind, fixed ...bool) (*queueState, *os.File) {
	t.Helper()
	s := hostThread(t, 4*QueueCost(depth), 1)
	s.bufSlots.alloc(int(depth)) // slot 0's run: the queue's starts after it
	return hostQueue(t, s, depth, kind, fixed...)
}

// hostThread builds a server thread's state for hostLoop and hostQueue:
// a real ring sized for tags, and room for queues queues in slots 1 and up.
func hostThread(t testing.TB, tags, queues int) *threadLoop {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	th := &Thread{cfg: ThreadConfig{Tags: tags, Queues: queues + 1}, done: make(chan struct{})}
	ring, err := uring.New(uring.Config{Entries: uint32(tags) + 1, CQEntries: 2*uint32(tags) + 2, Flags: ringFlags})
	if err != nil {
		t.Fatal(err)
	}
	s := &threadLoop{t: th, ring: ring, cqes: make([]uring.CQE, 2*tags+2), slots: make([]*queueState, queues+1),
		bufSlots: newRangeAlloc(tags)}
	for i := queues; i >= 1; i-- {
		s.free = append(s.free, uint16(i))
	}
	t.Cleanup(func() { s.close(nil) })
	if err := s.register(); err != nil {
		t.Fatal(err)
	}
	return s
}

// hostQueue attaches a queue of depth over a scratch file to s (see
// hostLoop) and reaps the FETCHes of its tags.
func hostQueue(t testing.TB, s *threadLoop, depth uint16, kind TargetKind, fixed ...bool) (*queueState, *os.File) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "backing"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	return attachHost(t, s, QueueConfig{Depth: depth, CharFD: int(f.Fd()), MaxIOBytes: 64 << 10,
		Target: Target{Kind: kind, FD: int(f.Fd())}, Options: QueueOptions{FixedBuffers: len(fixed) > 0 && fixed[0]}}), f
}

// attachHost attaches a queue of cfg to s (see hostLoop), its memory
// mapped as StartQueue maps it, and reaps the FETCHes of its tags.
func attachHost(t testing.TB, s *threadLoop, cfg QueueConfig) *queueState {
	t.Helper()
	depth := cfg.Depth
	if err := s.t.reserve(depth); err != nil {
		t.Fatal(err)
	}
	q := &Queue{cfg: cfg, thread: s.t, done: make(chan struct{})}
	l := newQueueState(q)
	l.descs = &descArea{mem: make([]byte, int(depth)*uapi.SizeofIODesc), depth: int(depth)}
	var err error
	if l.bufs, l.pool, err = mapQueueMemory(&q.cfg, l.uc); err != nil {
		t.Fatal(err)
	}
	if err := s.attach(l); err != nil {
		t.Fatal(err)
	}
	// attach FETCHed every tag; on a regular file those fail at once.
	for got := 0; got < int(depth); {
		if _, err := s.ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatalf("reap fetches: %v", err)
		}
		got += s.ring.Reap(s.cqes)
	}
	s.parked = 0 // reaped here, not by onCmd: none is parked
	return l
}

// setDesc writes tag's descriptor as the kernel would.
func setDesc(l *queueState, tag uint16, opFlags, nrSectors uint32, start uint64) {
	b := l.descs.mem[int(tag)*uapi.SizeofIODesc:]
	binary.LittleEndian.PutUint32(b[0:], opFlags)
	binary.LittleEndian.PutUint32(b[4:], nrSectors)
	binary.LittleEndian.PutUint64(b[8:], start)
}

// step submits what the loop prepared, waits for one completion and hands
// backing completions to the loop; it returns the ublk command results.
func step(t testing.TB, l *queueState, cmds []int32) []int32 {
	if _, err := l.ring.SubmitAndWait(1, 5*time.Second); err != nil {
		t.Fatalf("submit and wait: %v", err)
	}
	n := l.ring.Reap(l.s.cqes)
	for i := range n {
		c := &l.s.cqes[i]
		kind, slot, tag := decodeUD(c.UserData)
		if slot != l.slot {
			t.Fatalf("completion for slot %d, the queue is in slot %d", slot, l.slot)
		}
		var err error
		switch kind {
		case udCmd:
			cmds = append(cmds, c.Res)
		case udCopy:
			err = l.onCopy(tag, c.Res)
		default:
			err = l.onBacking(tag, c.Res)
		}
		if err != nil {
			t.Fatalf("completion %d of tag %d: %v", kind, tag, err)
		}
	}
	return cmds
}

// statsNow publishes the queue's counters, as the end of a round does, and
// returns them.
func (l *queueState) statsNow() QueueStats {
	l.s.publish()
	return l.q.stats.snapshot()
}

// serveOne drives one request of tag from arrival to its COMMIT SQE.
func serveOne(t testing.TB, l *queueState, tag uint16) {
	if err := l.onCmd(tag, uapi.IOResOK); err != nil {
		t.Fatalf("onCmd: %v", err)
	}
	var cmds [4]int32
	for got := cmds[:0]; len(got) == 0; {
		got = step(t, l, got)
	}
}

func TestLoopReadWrite(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		name := map[bool]string{false: "user buffers", true: "fixed buffers"}[fixed]
		t.Run(name, func(t *testing.T) { testLoopReadWrite(t, fixed) })
	}
}

func testLoopReadWrite(t *testing.T, fixed bool) {
	l, f := hostLoop(t, 4, TargetFile, fixed)
	if wantHead := map[bool]uint32{false: 0, true: FixedHeadBytes}[fixed]; l.fixed != wantHead {
		t.Fatalf("registered head = %d bytes, want %d", l.fixed, wantHead)
	}
	// 8 KiB fits the registered head; 32 KiB is larger and takes the
	// unregistered path: both must move the same bytes.
	roundTrip(t, l, f, bytes.Repeat([]byte("fastblk!"), 1024), 8, uapi.IOFlagFUA)
	roundTrip(t, l, f, bytes.Repeat([]byte("fastblk big i/o!"), 2048), 64, 0)
	setDesc(l, 3, uapi.IOOpDiscard, 16, 8)
	serveOne(t, l, 3)
	got := make([]byte, 8<<10)
	if _, err := f.ReadAt(got, 4096); err != nil || !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatalf("discarded range is not zero (err %v)", err)
	}
	setDesc(l, 0, uapi.IOOpFlush, 0, 0)
	serveOne(t, l, 0)
	st := l.statsNow()
	if st.Reads != 2 || st.Writes != 2 || st.Discards != 1 || st.Flushes != 1 || st.Errors != 0 || st.InFlight != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

// roundTrip writes data at sector through tag 1 (with writeFlags) and reads
// it back through tag 2, checking the backing file and the read buffer.
func roundTrip(t *testing.T, l *queueState, f *os.File, data []byte, sector uint64, writeFlags uint32) {
	t.Helper()
	n := uint32(len(data) / 512)
	copy(l.bufs.slice(1), data)
	setDesc(l, 1, uapi.IOOpWrite|writeFlags, n, sector)
	serveOne(t, l, 1)
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, int64(sector)*512); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("backing file after a %d-byte WRITE differs (err %v)", len(data), err)
	}
	clear(l.bufs.slice(2))
	setDesc(l, 2, uapi.IOOpRead, n, sector)
	serveOne(t, l, 2)
	if !bytes.Equal(l.bufs.slice(2)[:len(data)], data) {
		t.Fatalf("buffer after a %d-byte READ differs", len(data))
	}
}

// TestPrepRWFixedHead pins which backing opcode a copy-mode transfer gets:
// READ_FIXED/WRITE_FIXED while it lies within the registered head of the
// tag's buffer, plain READ/WRITE past it (including the rest of a short
// transfer that started inside it), and always plain without registration.
func TestPrepRWFixedHead(t *testing.T) {
	for _, tc := range []struct {
		fixed    bool
		act      action
		done, n  uint32
		wantCode uint8
	}{
		{true, actWrite, 0, 4 << 10, uring.IORING_OP_WRITE_FIXED},
		{true, actRead, 0, FixedHeadBytes, uring.IORING_OP_READ_FIXED},
		{true, actRead, 0, FixedHeadBytes + 4096, uring.IORING_OP_READ},
		{true, actWrite, 12 << 10, 8 << 10, uring.IORING_OP_WRITE},
		{true, actWrite, 8 << 10, 8 << 10, uring.IORING_OP_WRITE_FIXED},
		{false, actRead, 0, 4 << 10, uring.IORING_OP_READ},
	} {
		l, _ := hostLoop(t, 2, TargetFile, tc.fixed)
		l.tags[1].plan.act, l.tags[1].done = tc.act, tc.done
		var sqe uring.SQE
		l.prepRW(&sqe, 1, 0, tc.n)
		if sqe.Opcode != tc.wantCode {
			t.Errorf("registered=%v act=%v done=%d n=%d: opcode %d, want %d", tc.fixed, tc.act, tc.done, tc.n, sqe.Opcode, tc.wantCode)
		}
	}
}

func TestLoopFailures(t *testing.T) {
	cases := []struct {
		name    string
		opFlags uint32
		sectors uint32
		start   uint64
	}{
		// A read at EOF returns 0: never commit a short count.
		{"read at EOF", uapi.IOOpRead, 8, 1 << 20 >> 9},
		// A read across EOF is short (4 KiB); the rest returns 0.
		{"read across EOF", uapi.IOOpRead, 16, (1<<20 - 4096) >> 9},
		{"larger than the buffer", uapi.IOOpWrite, 64<<10>>9 + 8, 0},
		{"unsupported op", uapi.IOOpWriteSame, 8, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _ := hostLoop(t, 2, TargetFile)
			setDesc(l, 0, c.opFlags, c.sectors, c.start)
			if err := l.onCmd(0, uapi.IOResOK); err != nil {
				t.Fatal(err)
			}
			cmds := make([]int32, 0, 4)
			for len(cmds) == 0 {
				cmds = step(t, l, cmds)
			}
			if st := l.statsNow(); st.Errors != 1 || st.InFlight != 0 {
				t.Fatalf("stats = %+v, want one error", st)
			}
		})
	}
}

func TestLoopDispatchAllocs(t *testing.T) {
	for _, c := range []struct {
		name string
		kind TargetKind
		op   uint32
	}{{"file read", TargetFile, uapi.IOOpRead}, {"file write", TargetFile, uapi.IOOpWrite}, {"null read", TargetNull, uapi.IOOpRead}} {
		t.Run(c.name, func(t *testing.T) {
			l, _ := hostLoop(t, 2, c.kind)
			setDesc(l, 0, c.op, 8, 0)
			serveOne(t, l, 0) // warm up
			if n := testing.AllocsPerRun(200, func() { serveOne(t, l, 0) }); n != 0 {
				t.Fatalf("%v allocations per request", n)
			}
		})
	}
}

// BenchmarkLoopDispatch serves 4 KiB reads from a page-cache file through the
// whole per-request path (descriptor, backing SQE, completion, COMMIT SQE).
func BenchmarkLoopDispatch(b *testing.B) {
	l, _ := hostLoop(b, 2, TargetFile)
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	b.ReportAllocs()
	for b.Loop() {
		serveOne(b, l, 0)
	}
}

func TestDescLayout(t *testing.T) {
	for _, c := range []struct {
		name     string
		qid      uint16
		depth    uint16
		pageSize int
		off      int64
		length   int
	}{
		{"q0 4k pages", 0, 128, 4096, 0, 4096},
		{"q1 4k pages", 1, 128, 4096, 98304, 4096},
		{"q3 depth 4096", 3, 4096, 4096, 3 * 98304, 98304},
		{"q1 64k pages", 1, 128, 65536, 131072, 65536},
		{"q2 depth 171", 2, 171, 4096, 2 * 98304, 8192},
	} {
		t.Run(c.name, func(t *testing.T) {
			if off := descOffset(c.qid, c.pageSize); off != c.off {
				t.Fatalf("descOffset = %d, want %d", off, c.off)
			}
			if n := descLength(c.depth, c.pageSize); n != c.length {
				t.Fatalf("descLength = %d, want %d", n, c.length)
			}
		})
	}
}

func TestQueueConfigValidate(t *testing.T) {
	good := QueueConfig{Depth: 64, CharFD: 3, MaxIOBytes: 512 << 10, Target: FileTarget(4), Thread: &Thread{}}
	cases := []struct {
		name string
		mod  func(*QueueConfig)
		ok   bool
	}{
		{"good", func(*QueueConfig) {}, true},
		{"no thread", func(c *QueueConfig) { c.Thread = nil }, false},
		{"zero copy needs no buffer size", func(c *QueueConfig) { c.Flags, c.MaxIOBytes = uapi.FlagAutoBufReg, 0 }, true},
		{"null target", func(c *QueueConfig) { c.Target = NullTarget() }, true},
		{"depth 0", func(c *QueueConfig) { c.Depth = 0 }, false},
		{"depth 4097", func(c *QueueConfig) { c.Depth = 4097 }, false},
		{"no char fd", func(c *QueueConfig) { c.CharFD = -1 }, false},
		{"no backing fd", func(c *QueueConfig) { c.Target.FD = -1 }, false},
		{"no target", func(c *QueueConfig) { c.Target = Target{} }, false},
		{"user copy", func(c *QueueConfig) { c.Flags = uapi.FlagUserCopy }, true},
		{"user copy in batches", func(c *QueueConfig) { c.Flags = uapi.FlagUserCopy | uapi.FlagBatchIO }, false},
		{"manual zero copy", func(c *QueueConfig) { c.Flags = uapi.FlagSupportZeroCopy }, false},
		{"batch io", func(c *QueueConfig) { c.Flags = uapi.FlagBatchIO | uapi.FlagAutoBufReg }, true},
		{"need get data", func(c *QueueConfig) { c.Flags = uapi.FlagNeedGetData }, false},
		{"odd buffer", func(c *QueueConfig) { c.MaxIOBytes = 1000 }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.mod(&cfg)
			if err := cfg.validate(); (err == nil) != c.ok {
				t.Fatalf("validate = %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestStartQueueRejectsBadConfig(t *testing.T) {
	if _, err := StartQueue(QueueConfig{Depth: 0}); err == nil {
		t.Fatal("StartQueue accepted depth 0")
	}
}

// TestLoopServesZeroingUpToTheAdvertisedLimit sends DISCARD and
// WRITE_ZEROES (with and without NOUNMAP) of 2 GiB, 3 GiB and the largest
// the device advertises (MaxZeroSectors, about 4 GiB) over a sparse 8 GiB
// backing file, as blkdiscard, BLKZEROOUT and mkfs do on a large volume:
// each must succeed and leave its range reading zeros, with the data just
// past its end intact. Requests of 2 GiB and more used to fail with EINVAL.
func TestLoopServesZeroingUpToTheAdvertisedLimit(t *testing.T) {
	l, f := hostLoop(t, 2, TargetFile)
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	mark := bytes.Repeat([]byte("live"), 1024)
	for _, c := range []struct {
		name    string
		opFlags uint32
		sectors uint32
	}{
		{"discard 2GiB", uapi.IOOpDiscard, 2 << 30 >> 9},
		{"discard 3GiB", uapi.IOOpDiscard, 3 << 30 >> 9},
		{"discard max", uapi.IOOpDiscard, MaxZeroSectors},
		{"write zeroes 3GiB", uapi.IOOpWriteZeroes, 3 << 30 >> 9},
		{"write zeroes nounmap 3GiB", uapi.IOOpWriteZeroes | uapi.IOFlagNoUnmap, 3 << 30 >> 9},
		{"write zeroes max", uapi.IOOpWriteZeroes, MaxZeroSectors},
	} {
		// No subtests: the ring is registered to this test's thread.
		{
			start := uint64(8) // 4 KiB in: the range ends unaligned to 1 GiB
			end := int64(start+uint64(c.sectors)) << 9
			// Data at the range's last 4 KiB and just past its end.
			for _, at := range []int64{end - 4096, end} {
				if _, err := f.WriteAt(mark, at); err != nil {
					t.Fatal(err)
				}
			}
			before := l.statsNow().Errors
			setDesc(l, 0, c.opFlags, c.sectors, start)
			serveOne(t, l, 0)
			if st := l.statsNow(); st.Errors != before || st.InFlight != 0 {
				t.Fatalf("%s: stats = %+v, want no error", c.name, st)
			}
			got := make([]byte, len(mark))
			if _, err := f.ReadAt(got, end-4096); err != nil || !bytes.Equal(got, make([]byte, len(got))) {
				t.Fatalf("the range's last block is not zero after %s (err %v)", c.name, err)
			}
			if _, err := f.ReadAt(got, end); err != nil || !bytes.Equal(got, mark) {
				t.Fatalf("the block past the range changed after %s (err %v)", c.name, err)
			}
		}
	}
}
