package dataplane

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// The USER_COPY data path on any kernel with io_uring: the queue's "char
// device" is a scratch file, whose bytes at a request's position
// (userCopyPos) stand for the request's data as /dev/ublkcN would show it.
// A WRITE's data is put there before the request is served and must reach
// the backing file; a READ's must appear there.

// hostUserCopy attaches a USER_COPY queue of depth tags to a host thread
// (see hostLoop): requests up to maxIO bytes, a pool of pool bytes, copies
// on the thread up to inline bytes. It returns the queue, its backing file
// and its char file.
func hostUserCopy(t *testing.T, depth uint16, maxIO uint32, pool int, inline uint32) (*queueState, *os.File, *os.File) {
	t.Helper()
	s := hostThread(t, 4*QueueCost(depth), 1)
	s.bufSlots.alloc(int(depth))
	dir := t.TempDir()
	var files [2]*os.File
	for i, name := range []string{"backing", "char"} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files[i] = f
	}
	backing, char := files[0], files[1]
	if err := backing.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	l := attachHost(t, s, QueueConfig{Depth: depth, CharFD: int(char.Fd()), Flags: uapi.FlagUserCopy, MaxIOBytes: maxIO,
		PoolBytes: pool, Target: FileTarget(int(backing.Fd())), Options: QueueOptions{FixedBuffers: true, CopyInlineBytes: inline}})
	if !l.uc {
		t.Fatal("queue with USER_COPY does not copy through the char device")
	}
	return l, backing, char
}

// requestData puts data where tag's request shows it on the char device.
func requestData(t *testing.T, char *os.File, tag uint16, data []byte) {
	t.Helper()
	if _, err := char.WriteAt(data, userCopyPos(0, tag, 0)); err != nil {
		t.Fatal(err)
	}
}

// serveAll has the requests of tags arrive together and steps the queue
// until every one of them has committed.
func serveAll(t *testing.T, l *queueState, tags ...uint16) {
	t.Helper()
	for _, tag := range tags {
		if err := l.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatalf("onCmd %d: %v", tag, err)
		}
	}
	var buf [8]int32
	for cmds := buf[:0]; len(cmds) < len(tags); {
		cmds = step(t, l, cmds)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
	return b
}

// TestUserCopyMovesDataThroughTheCharDevice writes and reads requests of
// sizes around the tag buffer, the inline limit and the pool chunk through
// a USER_COPY queue: copied on the thread (all inline), off it (every
// request above 4 KiB linked to its backing I/O) and as the default
// splits them. The data must arrive where it belongs both ways, and the
// linked copies are counted.
func TestUserCopyMovesDataThroughTheCharDevice(t *testing.T) {
	sizes := []int{4 << 10, 16 << 10, 48 << 10, 64 << 10, 68 << 10, 256 << 10}
	for _, c := range []struct {
		name   string
		inline uint32
	}{{"on the thread", math.MaxUint32}, {"off the thread", 4096}, {"default", 0}} {
		t.Run(c.name, func(t *testing.T) {
			l, backing, char := hostUserCopy(t, 4, 256<<10, 512<<10, c.inline)
			inline := c.inline
			if inline == 0 {
				inline = DefaultCopyInlineBytes
			}
			want := uint64(0)
			for i, n := range sizes {
				data := pattern(n, byte(i))
				sector := uint64(i) * (256 << 10) >> 9
				requestData(t, char, 1, data)
				setDesc(l, 1, uapi.IOOpWrite, uint32(n>>9), sector)
				serveAll(t, l, 1)
				got := make([]byte, n)
				if _, err := backing.ReadAt(got, int64(sector)<<9); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%d-byte WRITE: backing file differs (err %v)", n, err)
				}
				requestData(t, char, 2, make([]byte, n))
				setDesc(l, 2, uapi.IOOpRead, uint32(n>>9), sector)
				serveAll(t, l, 2)
				if _, err := char.ReadAt(got, userCopyPos(0, 2, 0)); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%d-byte READ: the request's data differs (err %v)", n, err)
				}
				if uint32(n) > inline {
					want += 2
				}
			}
			st := l.statsNow()
			if st.Errors != 0 || st.InFlight != 0 || st.CopyOffloads != want || st.PoolWaits != 0 {
				t.Fatalf("stats = %+v, want no errors and %d copies off the thread", st, want)
			}
		})
	}
}

// TestUserCopyPoolServesLargeRequestsInOrder fills a pool that lends one
// 256 KiB request at a time with three of them and a 4 KiB one: the small
// one goes on in its tag's buffer, the second and third large ones wait,
// counted as backing I/O for Pause, and go on in order as runs come back.
func TestUserCopyPoolServesLargeRequestsInOrder(t *testing.T) {
	l, backing, char := hostUserCopy(t, 4, 256<<10, 256<<10, 0)
	var datas [4][]byte
	for tag := range uint16(4) {
		n := 256 << 10
		if tag == 3 {
			n = 4096
		}
		datas[tag] = pattern(n, byte(10+tag))
		requestData(t, char, tag, datas[tag])
		setDesc(l, tag, uapi.IOOpWrite, uint32(n>>9), uint64(tag)*(256<<10)>>9)
		if err := l.onCmd(tag, uapi.IOResOK); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.statsNow(); st.PoolWaits != 2 || l.q.stats.backing.Load() != 4 {
		t.Fatalf("after four arrivals: %d waits, %d backing operations; want 2 waits of 4", st.PoolWaits, l.q.stats.backing.Load())
	}
	if got := l.pool.waiting[l.pool.waitHead : l.pool.waitHead+2]; got[0] != 1 || got[1] != 2 {
		t.Fatalf("waiting tags %v, want [1 2]", got)
	}
	for cmds := make([]int32, 0, 4); len(cmds) < 4; {
		cmds = step(t, l, cmds)
	}
	for tag, data := range datas {
		got := make([]byte, len(data))
		if _, err := backing.ReadAt(got, int64(tag)*(256<<10)); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("tag %d: backing file differs (err %v)", tag, err)
		}
	}
	if st := l.statsNow(); st.Errors != 0 || st.InFlight != 0 || st.PoolWaits != 2 || l.q.stats.backing.Load() != 0 || l.pool.waitLen != 0 {
		t.Fatalf("stats = %+v, backing %d, waiting %d", st, l.q.stats.backing.Load(), l.pool.waitLen)
	}
}

// TestUserCopyFailedCopyFailsTheRequest makes the copy fail: a WRITE whose
// data cannot be read (its position lies beyond the end of the char file,
// so the read is short) must fail without touching the backing file, and
// a READ whose data cannot be written (the char file is open read-only)
// must fail too, on the thread and off it.
func TestUserCopyFailedCopyFailsTheRequest(t *testing.T) {
	for _, inline := range []uint32{math.MaxUint32, 4096} {
		l, backing, _ := hostUserCopy(t, 2, 256<<10, 256<<10, inline)
		old := pattern(64<<10, 1)
		if _, err := backing.WriteAt(old, 0); err != nil {
			t.Fatal(err)
		}
		setDesc(l, 0, uapi.IOOpWrite, 64<<10>>9, 0)
		serveAll(t, l, 0)
		got := make([]byte, len(old))
		if _, err := backing.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
			t.Fatalf("inline %d: a WRITE whose copy failed changed the backing file (err %v)", inline, err)
		}
		if st := l.statsNow(); st.Errors != 1 || st.InFlight != 0 || st.Writes != 1 {
			t.Fatalf("inline %d: stats after the failed WRITE = %+v", inline, st)
		}
	}
	for _, inline := range []uint32{math.MaxUint32, 4096} {
		l, _, char := hostUserCopy(t, 2, 256<<10, 256<<10, inline)
		ro, err := os.Open(char.Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ro.Close() })
		l.cfg.CharFD = int(ro.Fd())
		if err := l.ring.UpdateFiles(uint32(l.fileChar), []int32{int32(ro.Fd())}); err != nil {
			t.Fatal(err)
		}
		setDesc(l, 1, uapi.IOOpRead, 64<<10>>9, 0)
		serveAll(t, l, 1)
		if st := l.statsNow(); st.Errors != 1 || st.InFlight != 0 || st.Reads != 1 {
			t.Fatalf("inline %d: stats after the failed READ = %+v", inline, st)
		}
	}
}

// TestUserCopyPoolRequestsUsePlainOps pins the backing opcode of a request
// in the pool: plain READ/WRITE (the pool is not registered), where one in
// the tag's registered buffer uses READ_FIXED/WRITE_FIXED.
func TestUserCopyPoolRequestsUsePlainOps(t *testing.T) {
	l, _, _ := hostUserCopy(t, 2, 256<<10, 256<<10, math.MaxUint32)
	for _, c := range []struct {
		n    uint32
		want uint8
	}{{4096, uring.IORING_OP_WRITE_FIXED}, {UserCopyTagBytes, uring.IORING_OP_WRITE_FIXED}, {UserCopyTagBytes + 4096, uring.IORING_OP_WRITE}} {
		tg := &l.tags[1]
		tg.req, tg.plan, tg.done = request{op: uapi.IOOpWrite, len: c.n}, plan{act: actWrite}, 0
		if l.needsRun(tg) && !l.pool.take(tg) {
			t.Fatalf("%d bytes: no run in an empty pool", c.n)
		}
		var sqe uring.SQE
		l.prepRW(&sqe, 1, 0, c.n)
		if sqe.Opcode != c.want {
			t.Errorf("%d-byte write: opcode %d, want %d", c.n, sqe.Opcode, c.want)
		}
		if tg.runLen > 0 {
			l.pool.give(tg)
		}
	}
}

func TestUserCopyDispatchAllocs(t *testing.T) {
	for _, c := range []struct {
		name   string
		op     uint32
		n      uint32
		inline uint32
	}{{"inline write", uapi.IOOpWrite, 4096, 0}, {"inline read", uapi.IOOpRead, 4096, 0},
		{"linked write", uapi.IOOpWrite, 256 << 10, 0}, {"linked read", uapi.IOOpRead, 256 << 10, 0}} {
		t.Run(c.name, func(t *testing.T) {
			l, _, char := hostUserCopy(t, 2, 256<<10, 256<<10, c.inline)
			requestData(t, char, 0, make([]byte, c.n))
			setDesc(l, 0, c.op, c.n>>9, 0)
			serveAll(t, l, 0) // warm up
			if n := testing.AllocsPerRun(50, func() { serveAll(t, l, 0) }); n != 0 {
				t.Fatalf("%v allocations per request", n)
			}
		})
	}
}
