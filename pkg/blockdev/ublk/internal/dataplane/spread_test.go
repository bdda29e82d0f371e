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

// TestPlaceQueues pins how queues the kernel maps to CPUs are placed on
// pinned threads: each on the least loaded thread of one of its CPUs, and
// where none of those has room, or the queue names no CPU a thread is on,
// as SpreadQueues would.
func TestPlaceQueues(t *testing.T) {
	for _, c := range []struct {
		name          string
		loads, cpus   []int
		near          [][]int
		want          []int
		wantThreadErr bool
	}{
		{"queue on its CPU's thread", []int{0, 0}, []int{0, 1}, [][]int{{1}, {0}}, []int{1, 0}, false},
		{"busier thread of its CPU beats an idle one elsewhere", []int{50, 0}, []int{0, 1}, [][]int{{0}}, []int{0}, false},
		{"least loaded of its CPUs", []int{30, 10, 20, 0}, []int{0, 1, 2, 3}, [][]int{{0, 1, 2}}, []int{1}, false},
		{"threads numbered apart from CPUs", []int{0, 0}, []int{5, 3}, [][]int{{3}, {5}}, []int{1, 0}, false},
		{"its CPU's thread full: spread", []int{95, 0, 20}, []int{0, 1, 2}, [][]int{{0}}, []int{1}, false},
		{"its CPU's thread failed: spread", []int{-1, 30, 0}, []int{0, 1, 2}, [][]int{{0}}, []int{2}, false},
		{"floating threads: spread", []int{10, 0}, []int{-1, -1}, [][]int{{0}, {1}}, []int{1, 0}, false},
		{"no CPUs known: spread", []int{10, 0}, []int{0, 1}, [][]int{nil, nil}, []int{1, 0}, false},
		{"two queues of one CPU: the second spread", []int{0, 0}, []int{0, 1}, [][]int{{0}, {0}}, []int{0, 1}, false},
		{"no room anywhere", []int{95, 95}, []int{0, 1}, [][]int{{0}}, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := PlaceQueues(c.loads, c.cpus, c.near, 10, 100)
			if c.wantThreadErr {
				if !errors.Is(err, ErrThreadFull) {
					t.Fatalf("PlaceQueues = %v, %v; want ErrThreadFull", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("PlaceQueues = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
