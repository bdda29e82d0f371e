package dataplane

import (
	"errors"
	"fmt"
	"os"
	"slices"
)

// errInvalid classifies bad arguments; the blockdev adapter maps it.
var errInvalid = os.ErrInvalid

// ErrThreadFull is the class of a queue refused because no server thread
// has room left for it (ThreadConfig.Tags, Queues).
var ErrThreadFull = errors.New("server thread full")

// SpreadQueues picks a server thread for each of a device's queues, given
// the tags each thread already serves (loads; -1 for a thread that must not
// be used), what one queue costs, and what a thread holds. Each queue goes
// to the least loaded thread that has room and serves no queue of this
// device yet, so that the device's queues run in parallel and devices
// balance over the threads; once every usable thread has one, the least
// loaded again. Ties go to the lower thread, so the choice is repeatable.
func SpreadQueues(loads []int, queues, cost, capacity int) ([]int, error) {
	return PlaceQueues(loads, nil, make([][]int, queues), cost, capacity)
}

// PlaceQueues is SpreadQueues for threads pinned to CPUs (cpus[i] is
// thread i's CPU, -1 for a thread that floats) and queues the kernel maps
// to CPUs (near[q] lists the CPUs whose requests blk-mq sends to queue q,
// as UBLK_U_CMD_GET_QUEUE_AFFINITY reports them). Each queue goes to the
// least loaded thread with room on one of its CPUs, so that a request is
// served, and completed, on the CPU that submitted it rather than across
// CPUs; a queue none of whose CPUs has a thread with room (or with no
// CPUs listed) is spread as SpreadQueues does.
func PlaceQueues(loads, cpus []int, near [][]int, cost, capacity int) ([]int, error) {
	load := append([]int(nil), loads...)
	used := make([]bool, len(load))
	out := make([]int, 0, len(near))
	for q, qcpus := range near {
		best := -1
		for pass := 0; pass < 3 && best < 0; pass++ {
			for i, l := range load {
				if l < 0 || l+cost > capacity || (pass < 2 && used[i]) {
					continue
				}
				if pass == 0 && (i >= len(cpus) || !slices.Contains(qcpus, cpus[i])) {
					continue
				}
				if best < 0 || l < load[best] {
					best = i
				}
			}
		}
		if best < 0 {
			return nil, fmt.Errorf("queue %d of %d: no server thread has room for %d more tags (each holds %d): %w",
				q, len(near), cost, capacity, ErrThreadFull)
		}
		out = append(out, best)
		used[best] = true
		load[best] += cost
	}
	return out, nil
}
