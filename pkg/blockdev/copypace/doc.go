// Package copypace paces a node's background copies (restores and clones
// made from a local source, and the streams of data to and from other
// nodes) by what they cost the node's volumes in use, not only by bytes per
// second.
//
// A Governor watches the devices of the node's attached volumes through
// the kernel's counters (/sys/block/<dev>/stat, which loop and ublk
// devices both keep). While one of them does I/O, it pauses the copies for
// a moment in each cycle and compares each device's completed I/Os and
// their mean latency while the copies ran and while they paused
// (estimate.go): what the copies cost the worst-hit device is the share of
// its IOPS they took. It then sets an allowance, the bytes per second all
// copies together may move: down in proportion when they cost more than
// the aim (three quarters of Budget, a fifth of the IOPS by default),
// doubled when they cost well under it. A copy that starts beside a volume
// in use starts at its floor and speeds up from there, so that a short
// copy cannot cost more than a long one. While no volume does I/O nothing
// is paused nor bounded but by the copies' own rates.
//
// A copy is never held back for ever: each moves at least its floor, a
// tenth of its rate (of 200 MiB/s for a copy without one; at least 1 MiB/s,
// the peer channel's least rate), however much it costs, and no pause lasts
// longer than a quarter of a second. A copy that must end by a deadline
// (Pacer.FinishBy: the call that waits for it) is never held so long that
// it would miss it.
//
// A copy asks its Pacer before each chunk (Wait): the Pacer waits out a
// pause and then for the copy's rate: its own limit, or its share of the
// allowance if that is lower, but not below its floor.
package copypace
