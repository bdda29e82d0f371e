// Package iogap measures how long I/O on a block device stalls: a Meter
// writes 4 KiB blocks with O_DIRECT, one at a time, and records the longest
// time between two completions. The tests that restart the plugin under
// I/O (an upgrade) read it for each restart.
//
// A Meter owns one goroutine and one fd; Close stops and waits for it.
package iogap

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const block = 4096

// Meter writes to a device and keeps the longest gap between completions
// since the last Reset.
type Meter struct {
	fd   int
	buf  []byte
	span int64 // bytes of the device the writes cycle over

	mu     sync.Mutex
	last   time.Time
	max    time.Duration
	writes int64
	err    error

	stop chan struct{}
	done chan struct{}
}

// Start opens path (a block device) and starts writing to its first span
// bytes.
func Start(path string, span int64) (*Meter, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	buf, err := unix.Mmap(-1, 0, block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map buffer: %w", err)
	}
	m := &Meter{fd: fd, buf: buf, span: max(span/block*block, block), last: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m, nil
}

func (m *Meter) run() {
	defer close(m.done)
	for off := int64(0); ; off = (off + block) % m.span {
		select {
		case <-m.stop:
			return
		default:
		}
		m.buf[0]++
		_, err := unix.Pwrite(m.fd, m.buf, off)
		now := time.Now()
		m.mu.Lock()
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("write at %d: %w", off, err)
		}
		m.max = max(m.max, now.Sub(m.last))
		m.last = now
		m.writes++
		m.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Reset forgets the longest gap so far.
func (m *Meter) Reset() {
	m.mu.Lock()
	m.max, m.last = 0, time.Now()
	m.mu.Unlock()
}

// Writes is how many writes completed since Start.
func (m *Meter) Writes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// Max returns the longest gap between completions since Reset (or since
// the last completion, if that is longer: a write still waiting counts),
// and the first write error.
func (m *Meter) Max() (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.max, time.Since(m.last)), m.err
}

// Close stops writing, waits for the write in flight and closes the fd.
func (m *Meter) Close() error {
	close(m.stop)
	<-m.done
	unix.Munmap(m.buf)
	return unix.Close(m.fd)
}

// Summary is the median and the worst of durations, in seconds.
func Summary(d []time.Duration) (median, worst float64) {
	if len(d) == 0 {
		return 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med.Seconds(), s[len(s)-1].Seconds()
}
