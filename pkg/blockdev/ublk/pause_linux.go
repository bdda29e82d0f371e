// Pausing a device: holding its requests while a copy of its backing file
// is taken.

package ublk

import (
	"context"
	"fmt"
	"time"
)

// pauseWait bounds how long Pause waits for the backing I/O in flight.
const pauseWait = 10 * time.Second

// Nudge wakes the threads of every queue once. After the rate limits
// changed, a thread sleeping until its first held request's old start
// books its held requests again at once.
func (d *Device) Nudge() {
	for _, q := range d.queues {
		q.Thread().Wake()
	}
}

// Pause holds every request that reaches the device from now on and waits
// until none of its backing operations is in flight: the backing file then
// holds every write acknowledged before and none after, and stays so until
// resume is called. The block device's users only see slower I/O. Used to
// copy or clone a raw block volume in use consistently.
func (d *Device) Pause(ctx context.Context) (resume func(), err error) {
	d.gate.Close()
	resume = func() {
		d.gate.Open()
		d.Nudge()
	}
	start := make([]uint64, len(d.queues))
	for i, q := range d.queues {
		start[i] = q.RoundMark()
	}
	err = poll(ctx, pauseWait, func() (bool, error) {
		d.Nudge()
		for i, q := range d.queues {
			select {
			case <-q.Done():
				continue
			default:
			}
			if !q.Settled(start[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		resume()
		return nil, fmt.Errorf("pause ublk device %d: %w", d.ID(), err)
	}
	d.gate.MarkSettled()
	return resume, nil
}
