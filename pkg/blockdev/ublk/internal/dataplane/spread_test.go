package dataplane

import (
	"errors"
	"slices"
	"testing"
)

// TestSpreadQueues pins how a device's queues are spread over server
// threads: each on the least loaded thread the device does not use yet,
// then the least loaded again; failed and full threads never.
func TestSpreadQueues(t *testing.T) {
	for _, c := range []struct {
		name          string
		loads         []int
		queues, cost  int
		capacity      int
		want          []int
		wantThreadErr bool
	}{
		{"empty, two queues on two threads", []int{0, 0}, 2, 10, 100, []int{0, 1}, false},
		{"least loaded first", []int{30, 10, 20}, 2, 10, 100, []int{1, 2}, false},
		{"more queues than threads: least loaded again", []int{0, 0}, 4, 10, 100, []int{0, 1, 0, 1}, false},
		{"failed thread skipped", []int{-1, 50}, 2, 10, 100, []int{1, 1}, false},
		{"full thread skipped", []int{95, 0}, 2, 10, 100, []int{1, 1}, false},
		{"no room anywhere", []int{95, 95}, 1, 10, 100, nil, true},
		{"balances a second device", []int{10, 0, 10, 0}, 2, 10, 100, []int{1, 3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := SpreadQueues(c.loads, c.queues, c.cost, c.capacity)
			if c.wantThreadErr {
				if !errors.Is(err, ErrThreadFull) {
					t.Fatalf("SpreadQueues = %v, %v; want ErrThreadFull", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("SpreadQueues = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
