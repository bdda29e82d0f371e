// Healing a failed server thread in the process: its devices re-adopted
// through user recovery onto the live threads and one started in its place.

package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// A server thread that fails (a panic in its loop, a broken ring) exits,
// and its ring is closed once it is gone (dataplane's Thread.finish); with
// them go the commands it had parked: the kernel treats the
// queues it served as a dead server's. What the driver then does, and so
// what a heal must wait for, differs (drivers/block/ublk_drv.c):
//
//   - Linux 6.12: cancelling the dead ring's commands requeues the requests
//     the thread had taken and not committed (USER_RECOVERY_REISSUE), and
//     schedules the device's quiesce, which waits until the requests that
//     live threads serve for the device are committed and then aborts
//     (-ENODEV) every command of every queue of the device: its queues on
//     live threads end too, and the device is QUIESCED.
//   - Linux 7.x: the cancel marks the device canceling (new requests wait
//     in the requeue list) and aborts only the dead ring's commands; its
//     queues on live threads keep theirs until QUIESCE_DEV (6.16+) aborts
//     them, sent again while one runs because a request committed after an
//     abort parks its tag again. The device becomes QUIESCED, and the
//     requests the dead thread held are requeued, when /dev/ublkcN is
//     released.
//
// Either way START_USER_RECOVERY waits for /dev/ublkcN to be released: our
// fd closed, the device's queues gone from every ring's file table and
// their descriptors unmapped, and the dead ring freed. The kernel frees a
// ring only once every operation it had in flight has completed, the
// backing reads and writes of the requests the thread held among them, and
// those requests are reissued only after END_USER_RECOVERY. So no backing
// write of the dead thread lands after its reissued request, or a later
// write to the same blocks, did; and no buffer it used is used again (its
// buffers stay mapped until the ring is freed).
//
// A device whose quiesce never ends stays LIVE, and its mutex held: the
// heal waits for QUIESCED by GET_DEV_INFO, which does not take the mutex,
// and reports such a device as needing a reboot (ErrDeviceWedged) instead
// of sending it commands that would block.
//
// A 6.12 driver resets each queue in START_USER_RECOVERY and warns there
// (WARN_ON_ONCE in ublk_queue_reinit) when the queue's old daemon still
// lives: a device with a queue on a live thread too gets one warning in the
// kernel log. Later drivers reset the queues when /dev/ublkcN is released
// (QUIESCE, 6.16+, is the mark taken for them) and do not warn. On a node
// where a warning panics the kernel (kernel.panic_on_warn) such a device is
// not re-adopted in the process.
//
// Seen on 6.12 (a pause test, not under fio): a request dispatched in the
// instant the thread dies can leave the device's quiesce waiting for it
// for good (state LIVE, START_USER_RECOVERY blocked on the device's mutex);
// the heal then fails, and health with it.
//
// Where a device cannot be re-adopted (its queues on live threads do not
// end: a driver without QUIESCE that does not abort them itself; the
// warning would panic the node; recovery fails) it keeps its I/O held and
// Health fails, so that the kubelet restarts the plugin, whose start
// re-adopts it (adopt): its old threads are all gone by then.

// beginHeal registers a heal with Close, which waits for it; false once
// Close began.
func (s *Server) beginHeal() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.heals.Add(1)
	return true
}

// healThread re-adopts, in the process, the devices of server thread t,
// which failed: it starts a thread in t's place, then re-adopts each device
// with a queue on t (rehome) onto the live threads.
func (s *Server) healThread(ctx context.Context, t *dataplane.Thread) {
	if nt, err := s.threads.Replace(t); err != nil {
		s.report(err, "ublk server thread not replaced: its devices are re-adopted on the other threads", "thread", t.ID())
	} else {
		go s.watch(nt)
	}
	var wg sync.WaitGroup
	for _, id := range s.volumesOf(t) {
		wg.Go(func() { s.healVolume(ctx, id, t) })
	}
	wg.Wait()
}

// Heal retries: the first after healRetryFirst, each next twice as late, at
// most healRetryMax; a heal gives up once its attempts and waits have taken
// healGiveUp while the volume's gate was open. A pause (a snapshot's copy)
// can hold a request on a live thread's queue for as long as the copy
// takes, and the device cannot be re-adopted before that request ends.
const (
	healRetryFirst = time.Second
	healRetryMax   = 15 * time.Second
	healGiveUp     = 2 * time.Minute
)

// errHealRetry marks a re-adoption's failure that a later attempt may not
// meet: the device's live queues did not end yet, or its old /dev/ublkcN
// was not released yet.
var errHealRetry = errors.New("not yet")

// healVolume re-adopts the volume's device after server thread t failed
// (rehome), again and again while the failure is one a later attempt may
// not meet. Until it gives up, Health does not fail for the volume (from
// the thread's failure on), so that the liveness probe does not restart the
// plugin in the middle of a pause's copy. A heal that gives up leaves the
// device holding its I/O, and Health fails until the plugin restarts.
func (s *Server) healVolume(ctx context.Context, id string, t *dataplane.Thread) {
	sv := s.get(id)
	if sv == nil {
		return
	}
	gate := sv.dev.gate
	s.setGaveUp(id, nil)
	var open time.Duration // attempts and waits with the gate open
	for wait := healRetryFirst; ; wait = min(2*wait, healRetryMax) {
		start, paused := time.Now(), gate.Closed()
		err := s.rehome(ctx, id, t)
		if err == nil {
			return
		}
		if !paused && !gate.Closed() {
			open += time.Since(start) + wait
		}
		if !errors.Is(err, errHealRetry) || open > healGiveUp || ctx.Err() != nil {
			s.setGaveUp(id, err) // Health fails from before the report
			s.report(err, "ublk device of a failed server thread not re-adopted: it holds its i/o, and health fails until the plugin restarts",
				"volumeID", id, "thread", t.ID())
			return
		}
		s.report(err, "ublk device of a failed server thread not re-adopted yet: trying again", "volumeID", id, "thread", t.ID(),
			"retryIn", wait, "paused", gate.Closed())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// setGaveUp records why the heal of the volume's device gave up (nil: a
// new one begins).
func (s *Server) setGaveUp(id string, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if why == nil {
		delete(s.gaveUp, id)
		return
	}
	if s.gaveUp == nil {
		s.gaveUp = map[string]error{}
	}
	s.gaveUp[id] = why
}

// rehome re-adopts the volume's device, a queue of which died with server
// thread t: its other queues end (endQueues), /dev/ublkcN is closed, and
// user recovery starts new queues on the server's threads (RecoverDevice)
// with the same backing file, rate limits and pause gate. A failure leaves
// the device served by nothing, its I/O held: the old Device stays, and its
// failed queue fails Health; new queues that could not be ended make it
// stuck (hold), as a re-adoption at start would.
func (s *Server) rehome(ctx context.Context, id string, t *dataplane.Thread) error {
	sv, unlock := s.lockVolume(id)
	defer unlock()
	if sv == nil || !sv.dev.servedBy(t) {
		return nil // detached, or re-adopted already
	}
	old := sv.dev
	if old.info.Flags&FlagQuiesce == 0 && old.servedByLive() && panicOnWarn() {
		return fmt.Errorf("re-adopt %s: the driver would warn (a queue's old thread still runs) and kernel.panic_on_warn is set: %w",
			id, errors.ErrUnsupported)
	}
	if err := old.endQueues(ctx); err != nil {
		if errors.Is(err, errQueuesLive) {
			err = fmt.Errorf("%w: %w", errHealRetry, err)
		}
		return fmt.Errorf("re-adopt %s: %w", id, err)
	}
	if err := old.closeChar(); err != nil {
		return fmt.Errorf("re-adopt %s: close %s: %w", id, charPath(old.ID()), err)
	}
	if err := failAt(fpHealing); err != nil {
		return fmt.Errorf("re-adopt %s: %w", id, err)
	}
	dev, err := RecoverDevice(ctx, s.ctl, old.ID(), DeviceConfig{Target: sv.st.target(sv.file), Tuning: sv.st.Tuning, Owner: s.owner,
		Queue: s.queueOptions(sv.st.NowaitWrites), Limiter: sv.lim, Threads: s.threads, Gate: old.gate, Changes: sv.changes})
	if err != nil {
		if errors.Is(err, errQueuesLive) {
			// Its new queues serve from the volume's file: the file
			// goes with them, kept open until they end (Detach).
			s.put(id, nil)
			s.hold(id, &stuck{dev: dev, file: sv.file, err: err})
		} else if dev == nil && errors.Is(err, unix.ETIME) && !errors.Is(err, ErrDeviceWedged) {
			// Nothing started: the old /dev/ublkcN is still held.
			err = fmt.Errorf("%w: %w", errHealRetry, err)
		}
		return fmt.Errorf("re-adopt %s: %w", id, err)
	}
	next := *sv
	next.dev = dev
	next.recoveries++
	// The old queues' requests in flight were requeued to the new ones,
	// which count them again.
	next.ended = sv.total()
	next.ended.InFlight = 0
	s.put(id, &next)
	// A pause lifted while the device was re-adopted woke the old
	// queues only: its new ones may hold requests behind the open gate.
	dev.Nudge()
	return nil
}

// servedBy reports whether a queue of the device ran on server thread t.
func (d *Device) servedBy(t *dataplane.Thread) bool {
	for _, q := range d.queues {
		if q.Thread() == t {
			return true
		}
	}
	return false
}

// servedByLive reports whether a queue of the device ran on a server thread
// that still runs.
func (d *Device) servedByLive() bool {
	for _, q := range d.queues {
		select {
		case <-q.Thread().Done():
		default:
			return true
		}
	}
	return false
}

// panicOnWarn reports whether a kernel warning panics this node; unknown
// (no /proc) counts as yes.
func panicOnWarn() bool {
	b, err := os.ReadFile("/proc/sys/kernel/panic_on_warn")
	return err != nil || strings.TrimSpace(string(b)) != "0"
}

// endQueues ends the device's queues that still run after one of them died
// with its server thread (see the top of this file): on a driver with
// QUIESCE by QUIESCE_DEV, sent again while a queue runs; elsewhere the
// driver's own quiesce ends them. A queue still running after nodeWait
// fails it with an error wrapping errQueuesLive.
func (d *Device) endQueues(ctx context.Context) error {
	deadline := time.Now().Add(nodeWait)
	for !d.queuesEnded() {
		if time.Now().After(deadline) {
			return fmt.Errorf("end the queues of ublk device %d: %w", d.ID(), errQueuesLive)
		}
		if d.info.Flags&FlagQuiesce != 0 {
			// EBUSY: a queue had no idle tag to abort within the
			// wait; the next round tries again.
			err := d.ctl.QuiesceDev(d.ID(), quiesceWait)
			if err != nil && !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("end the queues of ublk device %d: %w", d.ID(), err)
			}
		}
		err := poll(ctx, queueEndWait, func() (bool, error) { return d.queuesEnded(), nil })
		if err != nil && !errors.Is(err, unix.ETIME) {
			return fmt.Errorf("end the queues of ublk device %d: %w", d.ID(), err)
		}
	}
	return nil
}

// queueEndWait is how long endQueues waits for the queues before it sends
// QUIESCE_DEV again.
const queueEndWait = 200 * time.Millisecond
