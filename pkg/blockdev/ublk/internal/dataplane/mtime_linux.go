package dataplane

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// touchMtime sets the mtime of the open file fd to the current time,
// leaving its atime alone; the kernel sets the ctime with it. It is
// futimens(fd, {UTIME_OMIT, UTIME_NOW}).
func touchMtime(fd int) error {
	return setMtime(fd, unix.Timespec{Nsec: unix.UTIME_NOW})
}

// MtimeToucher keeps a backing file's mtime current for a device's queues
// (freshenMtime) on a goroutine of its own: utimensat takes the inode lock
// and may wait for the filesystem's journal, or for ever on a frozen
// filesystem, and a server thread serving other devices must never wait
// for one device's file. It works on a duplicate of the file's descriptor,
// so the file may be closed while an update is still under way.
type MtimeToucher struct {
	tick atomic.Int64 // the coarse clock's tick (ns) of the last update asked
	ask  chan struct{}
	once sync.Once
	done chan struct{} // closed when the updates ended and the dup is closed
}

// NewMtimeToucher starts the updates of fd's mtime; nil when fd cannot be
// duplicated (the writes then meet stale mtimes: refusals, which go to
// io-wq as they would without RWF_NOWAIT).
func NewMtimeToucher(fd int) *MtimeToucher {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	m := &MtimeToucher{ask: make(chan struct{}, 1), done: make(chan struct{})}
	go m.run(dup)
	return m
}

func (m *MtimeToucher) run(fd int) {
	defer close(m.done)
	defer unix.Close(fd)
	for range m.ask {
		_ = touchMtime(fd)
	}
}

// request asks for the mtime to be set at tick, unless a queue asked for
// that tick already; it never blocks. It reports whether it asked.
func (m *MtimeToucher) request(tick int64) bool {
	if last := m.tick.Load(); last == tick || !m.tick.CompareAndSwap(last, tick) {
		return false
	}
	select {
	case m.ask <- struct{}{}:
	default: // an update is asked for already
	}
	return true
}

// Close ends the updates once no queue asks any more. Idempotent.
func (m *MtimeToucher) Close() {
	if m != nil {
		m.once.Do(func() { close(m.ask) })
	}
}

// setMtime is futimens(fd, {UTIME_OMIT, mtime}): utimensat with a NULL path
// acts on fd itself, which unix.UtimesNanoAt cannot express, and this form
// allocates nothing.
func setMtime(fd int, mtime unix.Timespec) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, mtime}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// StaleMtimeRefusesNowait reports whether the filesystem holding dir
// refuses a direct write with RWF_NOWAIT when the write must also update
// the file's mtime: ext4 in Linux 7.x does (6.12's updates it inline). There
// QueueOptions.NowaitWrites keeps those writes on the server thread; where
// the kernel takes them, the option only adds an mtime update per clock
// tick and a try to writes it refuses for other reasons (holes to
// allocate).
//
// It writes one block of an unnamed temporary file (O_TMPFILE), so it
// leaves nothing behind, even if the process dies. A filesystem that
// refuses the NOWAIT write even with a fresh mtime reports false: the
// refusal is not about the mtime, and touching it would not help.
func StaleMtimeRefusesNowait(dir string) (bool, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Errorf("nowait probe in %s: temporary file: %w", dir, err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false, fmt.Errorf("nowait probe: buffer: %w", err)
	}
	defer unix.Munmap(buf)
	// A block written once: a write into a hole needs an allocation,
	// which NOWAIT refuses whatever the mtime.
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		return false, fmt.Errorf("nowait probe in %s: write: %w", dir, err)
	}
	nowaitWrite := func() (bool, error) {
		_, err := unix.Pwritev2(fd, [][]byte{buf}, 0, unix.RWF_NOWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("nowait probe in %s: RWF_NOWAIT write: %w", dir, err)
		}
		return true, nil
	}
	// With the mtime current the write must go through. A clock tick
	// between the touch and the write makes it stale again, so a few
	// tries see one without.
	for try := 1; ; try++ {
		if err := touchMtime(fd); err != nil {
			return false, fmt.Errorf("nowait probe in %s: set mtime: %w", dir, err)
		}
		ok, err := nowaitWrite()
		if err != nil {
			return false, err
		}
		if ok {
			break
		}
		if try == 10 {
			return false, nil
		}
	}
	if err := setMtime(fd, unix.Timespec{Sec: 1}); err != nil {
		return false, fmt.Errorf("nowait probe in %s: set mtime: %w", dir, err)
	}
	ok, err := nowaitWrite()
	return !ok && err == nil, err
}
