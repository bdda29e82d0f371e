// Pacing a locked ring thread's offers of its P to the Go scheduler.

package uring

import "time"

// OfferInterval is how often a locked thread that serves a ring, about to
// sleep in io_uring_enter, offers itself to the Go scheduler
// (runtime.Gosched: its P goes to another thread and comes back): just
// under the runtime's 10 ms limit on one goroutine's time slice.
//
// A locked goroutine that never reschedules outlives every slice, so the
// runtime's monitor thread (sysmon) takes its P away in the middle of each
// sleeping wait, and after every such take it checks again every 20 µs for
// a millisecond. The offer saves the monitor's CPU time, the ublk server's
// CPU per I/O and context switches (figures in
// docs/benchmark-studies.md, "Figures behind code comments").
const OfferInterval = 9 * time.Millisecond

// OfferDue reports whether a ring thread whose last offer to the scheduler
// was sinceLast ago should offer again before its next sleeping wait.
// Submit the prepared SQEs first: the offer must not delay them.
func OfferDue(sinceLast time.Duration) bool { return sinceLast >= OfferInterval }
