//go:build failpoint

package dataplane

import (
	"testing"
	"time"
)

// TestThreadReapsAllItsCQRingHolds looks inside a running server thread of
// 1024 tags: its reap array must hold as many CQEs as its CQ ring (2050).
// With 1024 busy completions left over from a round (the backlog), a light
// queue's new CQE must still find room at the next look, to be served
// ahead of them. Before, the array held 1024: a full backlog left the light
// CQE in the ring, in ring order behind the busy ones.
func TestThreadReapsAllItsCQRingHolds(t *testing.T) {
	p, err := NewThreads(1, ThreadConfig{Tags: 1024, CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	th := p.Threads()[0]
	type sizes struct{ reap, cq int }
	ch := make(chan sizes, 1)
	setRoundHook(func(s *threadLoop) {
		if s.t == th {
			select {
			case ch <- sizes{len(s.cqes), int(s.ring.CQEntries())}:
			default:
			}
		}
	})
	defer setRoundHook(nil)
	th.Wake()
	select {
	case got := <-ch:
		if got.reap < got.cq || got.reap-1024 < 1 {
			t.Fatalf("reap array of %d CQEs for a CQ ring of %d: a backlog of 1024 leaves no room for a light CQE", got.reap, got.cq)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the thread ran no round")
	}
}
