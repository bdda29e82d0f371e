package ublk

import (
	"errors"
	"testing"
)

// TestCheckThreads proves that a device is refused exactly when its queue
// threads and the reserve do not fit in the room left, and never when the
// room is unknown or unlimited.
func TestCheckThreads(t *testing.T) {
	room := func(n int64, err error) func() (int64, error) { return func() (int64, error) { return n, err } }
	cases := []struct {
		name    string
		room    func() (int64, error)
		queues  int
		refused bool
	}{
		{"no check", nil, 4, false},
		{"no limit", room(-1, nil), 4, false},
		{"unreadable", room(0, errors.New("no cgroup")), 4, false},
		{"fits exactly", room(2*ThreadsPerQueue+ThreadReserve, nil), 2, false},
		{"one short", room(2*ThreadsPerQueue+ThreadReserve-1, nil), 2, true},
		{"none left", room(0, nil), 1, true},
	}
	for _, c := range cases {
		err := checkThreads(c.room, c.queues)
		if refused := errors.Is(err, ErrThreadLimit); refused != c.refused || (err != nil && !refused) {
			t.Errorf("%s: checkThreads = %v, want refused %v", c.name, err, c.refused)
		}
	}
}
