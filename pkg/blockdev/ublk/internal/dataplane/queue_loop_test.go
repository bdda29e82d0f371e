package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
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
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "backing"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	th := &Thread{cfg: ThreadConfig{Tags: 4 * QueueCost(depth), Queues: 2}, done: make(chan struct{})}
	if err := th.reserve(depth); err != nil {
		t.Fatal(err)
	}
	q := &Queue{cfg: QueueConfig{Depth: depth, CharFD: int(f.Fd()), MaxIOBytes: 64 << 10,
		Target: Target{Kind: kind, FD: int(f.Fd())}, Options: QueueOptions{FixedBuffers: len(fixed) > 0 && fixed[0]}},
		thread: th, done: make(chan struct{})}
	tags := uint32(th.cfg.Tags)
	ring, err := uring.New(uring.Config{Entries: tags + 1, CQEntries: 2*tags + 2, Flags: ringFlags})
	if err != nil {
		t.Fatal(err)
	}
	s := &threadLoop{t: th, ring: ring, cqes: make([]uring.CQE, 2*tags+2), slots: make([]*queueState, 2),
		free: []uint16{1}, bufSlots: newRangeAlloc(th.cfg.Tags)}
	t.Cleanup(func() { s.close(nil) })
	if err := s.register(); err != nil {
		t.Fatal(err)
	}
	s.bufSlots.alloc(int(depth)) // slot 0's run: the queue's starts after it
	l := newQueueState(q)
	l.descs = &descArea{mem: make([]byte, int(depth)*uapi.SizeofIODesc), depth: int(depth)}
	if l.bufs, err = mapBuffers(depth, q.cfg.MaxIOBytes); err != nil {
		t.Fatal(err)
	}
	if err := s.attach(l); err != nil {
		t.Fatal(err)
	}
	// attach FETCHed every tag; on a regular file those fail at once.
	for got := 0; got < int(depth); {
		if _, err := ring.SubmitAndWait(1, 5*time.Second); err != nil {
			t.Fatalf("reap fetches: %v", err)
		}
		got += ring.Reap(s.cqes)
	}
	s.parked = 0 // reaped here, not by onCmd: none is parked
	return l, f
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
		if kind == udCmd {
			cmds = append(cmds, c.Res)
			continue
		}
		if err := l.onBacking(tag, c.Res); err != nil {
			t.Fatalf("onBacking: %v", err)
		}
	}
	return cmds
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
	st := l.q.stats.snapshot()
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
			if st := l.q.stats.snapshot(); st.Errors != 1 || st.InFlight != 0 {
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
		{"user copy", func(c *QueueConfig) { c.Flags = uapi.FlagUserCopy }, false},
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

// TestLoopPoll proves the poll path: after a busy round a completion that
// is already there is picked up without sleeping in io_uring_enter, and
// with nothing in flight the poll gives up after its budget.
// TestLoopPollInFlight proves the bound on polling by requests in service:
// with more than pollMaxInFlight the thread sleeps in io_uring_enter
// rather than poll, and ThreadConfig.PollInFlight (--ublk-poll-inflight)
// raises the bound so that it polls.
func TestLoopPollInFlight(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	l.cfg.Options.Poll = time.Second
	l.s.setPollWindow()
	others := pollMaxInFlight // requests of other queues in service
	for _, c := range []struct {
		pollMax int
		enters  uint64 // waits in io_uring_enter for the completion
	}{{0, 1}, {pollMaxInFlight + others, 0}} {
		l.s.pollMax = c.pollMax
		l.s.gapNs = int64(100 * time.Millisecond) // completions come within Poll
		setDesc(l, 0, uapi.IOOpRead, 8, 0)
		if err := l.onCmd(0, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
		l.s.serving += others
		before := l.s.t.stats.enters.Load()
		if n, err := l.s.next(true); err != nil || n != 1 {
			t.Fatalf("pollMax %d: next(busy) = %d, %v; want the backing completion", c.pollMax, n, err)
		}
		if e := l.s.t.stats.enters.Load() - before; e != c.enters {
			t.Errorf("pollMax %d with %d requests in service: %d waits in io_uring_enter, want %d",
				c.pollMax, l.s.serving, e, c.enters)
		}
		l.s.serving -= others
		if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
			t.Fatal(err)
		}
		// The COMMIT fails at once on a regular file; reap it.
		if n, err := l.s.next(true); err != nil || n != 1 {
			t.Fatalf("next(busy) = %d, %v; want the commit's completion", n, err)
		}
	}
}

func TestLoopPoll(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	l.cfg.Options.Poll = time.Second
	l.s.setPollWindow()
	l.s.gapNs = int64(100 * time.Millisecond) // completions come within Poll
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	if err := l.onCmd(0, uapi.IOResOK); err != nil {
		t.Fatal(err)
	}
	n, err := l.s.next(true)
	if err != nil || n != 1 {
		t.Fatalf("next(busy) = %d, %v; want the backing completion", n, err)
	}
	if e := l.s.t.stats.enters.Load(); e != 0 {
		t.Fatalf("%d waits in io_uring_enter, want none: the poll should have found the completion", e)
	}
	if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
		t.Fatal(err)
	}
	// The COMMIT fails at once on a regular file; reap it.
	if n, err := l.s.next(true); err != nil || n != 1 {
		t.Fatalf("next(busy) = %d, %v; want the commit's completion", n, err)
	}
	if l.s.gapNs >= int64(100*time.Millisecond) {
		t.Fatalf("wait average %v did not move toward the measured waits", time.Duration(l.s.gapNs))
	}
	l.cfg.Options.Poll, l.s.gapNs = 20*time.Millisecond, int64(10*time.Millisecond)
	l.s.setPollWindow()
	start := time.Now()
	if n, err := l.s.next(true); err != nil || n != 0 {
		t.Fatalf("next with nothing in flight = %d, %v", n, err)
	}
	if took := time.Since(start); took < l.cfg.Options.Poll {
		t.Fatalf("idle poll returned after %v, before its %v budget", took, l.cfg.Options.Poll)
	}
	if e := l.s.t.stats.enters.Load(); e != 1 {
		t.Fatalf("%d waits after an empty poll, want 1", e)
	}
	// Completions that usually take longer than Poll: no polling at all.
	l.s.gapNs = int64(time.Second)
	start = time.Now()
	if n, err := l.s.next(true); err != nil || n != 0 {
		t.Fatalf("next with nothing in flight = %d, %v", n, err)
	}
	if took := time.Since(start); took >= l.cfg.Options.Poll {
		t.Fatalf("next polled %v although completions come slower than Poll", took)
	}
}

// TestWaitFor pins the batched wait of a thread where no request can
// arrive: one completion when little is in flight, a quarter of the
// backing I/O when much is.
func TestWaitFor(t *testing.T) {
	for _, c := range []struct {
		backing int
		want    uint32
	}{{0, 1}, {1, 1}, {7, 1}, {8, 2}, {32, 8}, {64, 16}} {
		if got := (&threadLoop{backing: c.backing}).waitFor(); got != c.want {
			t.Errorf("waitFor with %d backing = %d, want %d", c.backing, got, c.want)
		}
	}
}

// TestWaitForNews pins the wait while requests can arrive: one completion
// whatever backing I/O is in flight, and the quarter of it once every tag
// is in service.
func TestWaitForNews(t *testing.T) {
	for _, c := range []struct {
		name    string
		parked  int
		backing int
		want    uint32
	}{
		{"idle", 64, 0, 1},
		{"busy, tags parked", 32, 256, 1},
		{"every tag in service", 0, 256, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &threadLoop{parked: c.parked, backing: c.backing}
			if got := s.waitFor(); got != c.want {
				t.Fatalf("waitFor = %d, want %d", got, c.want)
			}
		})
	}
}

// TestBatchWaitFor pins the wait of a thread with batch-mode queues: one
// CQE of news while a FETCH is armed (not a quarter of the backing I/O),
// plus one per PREP/COMMIT that owes its CQE; without an armed FETCH, the
// usual quarter of the backing I/O.
func TestBatchWaitFor(t *testing.T) {
	for _, c := range []struct {
		name     string
		fetchers int
		backing  int
		owed     int
		want     uint32
	}{
		{"idle", 1, 0, 0, 1},
		{"busy, commit sent", 1, 32, 1, 2},
		{"two queues busy, two commits sent", 2, 64, 2, 3},
		{"fetch ended, backing in flight", 0, 3, 0, 1},
		{"fetch ended, much backing in flight", 0, 32, 0, 8},
		{"fetch ended, last commit sent", 0, 0, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &threadLoop{fetchers: c.fetchers, backing: c.backing, batchCmds: c.owed}
			if got := s.waitFor(); got != c.want {
				t.Fatalf("waitFor = %d, want %d", got, c.want)
			}
		})
	}
}

// TestNewRequestDoesNotWaitForOtherBacking proves that a thread whose
// queues can receive requests wakes for the first one, whatever backing
// I/O of other devices is in flight: device A's backing reads are stalled
// (reads of a pipe nobody writes to: a backing file that hangs) and a
// request of device B arrives (its parked FETCH completes; here a poll
// standing in for the uring_cmd, which a regular file cannot park). Before,
// the thread waited for a quarter of A's backing I/O first, and B's request
// waited as long as A's file stalled: here until the test released A's
// reads after a few seconds.
func TestNewRequestDoesNotWaitForOtherBacking(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	const stalled = 16
	buf := make([]byte, 512)
	for i := range stalled {
		sqe := s.ring.GetSQE()
		sqe.PrepRead(int32(pr.Fd()), buf, ^uint64(0))    // a pipe has no offset
		sqe.UserData = encodeUD(udBacking, 0, uint16(i)) // slot 0: device A
		s.backing++
	}
	news, err := uring.NewWaker()
	if err != nil {
		t.Fatal(err)
	}
	defer news.Close()
	news.PrepPoll(s.ring.GetSQE(), encodeUD(udCmd, l.slot, 0))
	s.parked++ // device B's tag 0 waits for a request
	if err := news.Wake(); err != nil {
		t.Fatal(err)
	}
	// The bound of a wait that would never end: A's reads complete.
	release := time.AfterFunc(3*time.Second, func() { pw.Write(make([]byte, stalled*len(buf))) })
	n, err := s.next(false)
	released := !release.Stop()
	if err != nil {
		t.Fatal(err)
	}
	gotNews := false
	for _, c := range s.cqes[:n] {
		kind, slot, _ := decodeUD(c.UserData)
		gotNews = gotNews || (kind == udCmd && slot == l.slot)
	}
	if !gotNews || released {
		t.Fatalf("device B's request came back with %d CQEs (it did: %v) only after device A's stalled backing reads were released (%v): it waited for them",
			n, gotNews, released)
	}
}

// TestLoopOffersBeforeSleeping proves a round with an offer due still
// submits its backing I/O and gets the completion, and records the offer;
// a round right after an offer does not offer again.
func TestLoopOffersBeforeSleeping(t *testing.T) {
	l, _ := hostLoop(t, 2, TargetFile)
	for round := range 2 {
		setDesc(l, 0, uapi.IOOpRead, 8, 0)
		if err := l.onCmd(0, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
		l.s.offeredAt = monoNow() - int64(uring.OfferInterval) // due
		if round == 1 {
			l.s.offeredAt = monoNow() // just offered: not due again
		}
		before := l.s.offeredAt
		n, err := l.s.next(true)
		if err != nil || n != 1 {
			t.Fatalf("round %d: next = %d, %v; want the backing completion", round, n, err)
		}
		if offered := l.s.offeredAt != before; offered != (round == 0) {
			t.Fatalf("round %d: offered = %v, want %v", round, offered, round == 0)
		}
		if err := l.onBacking(0, l.s.cqes[0].Res); err != nil {
			t.Fatal(err)
		}
		if n, err := l.s.next(true); err != nil || n != 1 { // the failed COMMIT of a regular file
			t.Fatalf("round %d: next = %d, %v; want the commit's completion", round, n, err)
		}
	}
}

// TestDetachForgetsQueue proves that a queue that leaves its thread is off
// every list the thread keeps: the idle reclaim once reached the unmapped
// buffers of a detached copy-mode queue and panicked the thread (seen with
// 64 volumes in the VM).
func TestDetachForgetsQueue(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.cfg.Options.IdleReclaim = time.Millisecond
	l.tailsUsed, l.tailsAt = true, monoNow()-int64(time.Hour)
	l.inTails, s.tails = true, append(s.tails, l)
	s.detach(l, nil)
	if len(s.tails)+len(s.held)+len(s.commits)+len(s.ending) != 0 {
		t.Fatalf("detached queue still listed: tails %d held %d commits %d ending %d", len(s.tails), len(s.held), len(s.commits), len(s.ending))
	}
	s.reclaimIdle() // panicked on the unmapped buffers before
}

// TestPanicFailsOnlyItsQueue proves that a panic while one queue handles a
// completion fails that queue, with the cause, and the thread goes on with
// the round's other completions.
func TestPanicFailsOnlyItsQueue(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.bufs.close() // a broken queue: its next read copies into nothing
	l.bufs = nil
	l.zc = false
	setDesc(l, 0, uapi.IOOpRead, 8, 0)
	s.cqes[0] = uring.CQE{UserData: encodeUD(udCmd, l.slot, 0), Res: uapi.IOResOK}
	s.cqes[1] = uring.CQE{UserData: encodeUD(udCmd, 7, 0)} // a stray: handled after
	before := s.t.stats.stray.Load()
	s.dispatch(2)
	if err := l.q.Err(); !errors.Is(err, errQueuePanic) {
		t.Fatalf("queue error %v, want a panic failure", err)
	}
	if s.t.stats.stray.Load() != before+1 {
		t.Fatal("the round's next completion was not handled after the panic")
	}
}

// TestReclaimBacksOffWhileRingBusy proves that an idle queue's reclaim,
// refused because other completions are waiting in the shared ring, is
// tried again only after reclaimRetry: before, every round retried it with
// an extra system call and every wait was cut to a millisecond, which cost
// the plugin more CPU per I/O with 64 busy volumes than with 16.
func TestReclaimBacksOffWhileRingBusy(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	s := l.s
	l.cfg.Options.IdleReclaim = time.Millisecond
	l.tailsUsed, l.tailsAt = true, monoNow()-int64(time.Hour)
	l.inTails, s.tails = true, append(s.tails, l)
	sqe := s.ring.GetSQE() // another queue's completion, waiting in the ring
	sqe.PrepNop()
	if _, err := s.ring.SubmitAndWait(1, time.Second); err != nil {
		t.Fatal(err)
	}
	s.reclaimIdle()
	if !l.tailsUsed || len(s.tails) != 1 {
		t.Fatal("reclaimed while a completion was waiting in the ring")
	}
	if w := s.reclaimWait(monoNow()); w < reclaimRetry/2 {
		t.Fatalf("after a refused reclaim the wait is bounded to %v, want about %v", w, reclaimRetry)
	}
	s.ring.Reap(s.cqes)
	s.reclaimRetryAt = 0
	s.reclaimIdle()
	if l.tailsUsed || len(s.tails) != 0 {
		t.Fatal("not reclaimed once the ring was quiet")
	}
}

// TestLightFirstOrdersRound proves the light-first design's order: the
// completions of queues with few backing operations in flight first, then
// the busy queues', each side in ring order, none lost or duplicated.
func TestLightFirstOrdersRound(t *testing.T) {
	busy, quiet := &queueState{backing: 3 * lightBacking}, &queueState{backing: 1}
	s := &threadLoop{slots: []*queueState{busy, quiet}, cqes: make([]uring.CQE, 8)}
	order := []struct {
		slot, tag uint16
	}{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {0, 3}}
	for i, c := range order {
		s.cqes[i] = uring.CQE{UserData: encodeUD(udBacking, c.slot, c.tag)}
	}
	s.lightFirst(len(order))
	want := []struct{ slot, tag uint16 }{{1, 0}, {1, 1}, {0, 0}, {0, 1}, {0, 2}, {0, 3}}
	for i, w := range want {
		if _, slot, tag := decodeUD(s.cqes[i].UserData); slot != w.slot || tag != w.tag {
			t.Fatalf("cqe %d is slot %d tag %d, want slot %d tag %d", i, slot, tag, w.slot, w.tag)
		}
	}
}
