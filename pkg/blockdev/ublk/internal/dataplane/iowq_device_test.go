//go:build failpoint

package dataplane

import (
	"testing"
	"time"
)

// TestDeviceThreadRunsWithItsIOWQBound proves, against the host kernel, that
// a per-device pool's thread serves with the io-wq bound the pool gives it
// (PerDeviceIOWQWorkers bounded workers, or ThreadConfig.IOWQWorkers when
// set), read back on the thread itself (io-wq belongs to the task): the
// bound the documentation and the pids limit's reserve count on, and the
// one every write into a thin volume's holes goes through (ext4 refuses
// them under NOWAIT, and io_uring hands them to these workers).
func TestDeviceThreadRunsWithItsIOWQBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		set, want uint32
	}{
		{"pool default", 0, PerDeviceIOWQWorkers},
		{"set in the config", 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewDeviceThreads(1, ThreadConfig{IOWQWorkers: tc.set})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ths, err := p.Pick(1, 64)
			if err != nil {
				t.Fatal(err)
			}
			defer UnreserveAll(ths, 64)
			type bound struct {
				v   [2]uint32
				err error
			}
			ch := make(chan bound, 1)
			setRoundHook(func(s *threadLoop) {
				if s.t == ths[0] {
					v, err := s.ring.SetMaxWorkers(0, 0) // 0 changes nothing: a read
					select {
					case ch <- bound{v, err}:
					default:
					}
				}
			})
			defer setRoundHook(nil)
			ths[0].Wake()
			select {
			case got := <-ch:
				if got.err != nil {
					t.Fatal(got.err)
				}
				if got.v[0] != tc.want {
					t.Fatalf("the thread's io-wq bound: %d bounded workers, want %d", got.v[0], tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the thread ran no round within 10 s")
			}
		})
	}
}
