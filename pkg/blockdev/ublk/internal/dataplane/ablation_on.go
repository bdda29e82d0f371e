//go:build ablation

package dataplane

import (
	"fmt"
	"os"
	"strings"
)

// Ablation switches off, one by one, the techniques the server threads are
// built on, so that a benchmark can measure what each is worth
// (docs/benchmark-studies.md, "Ablation"). The zero value is the product;
// the plugin sets it only from its --ublk-ablate flag. Only binaries built
// with -tags ablation (benchmarks, tests) have the switches: in every other
// build Ablation is empty and every technique is on (ablation_off.go).
type Ablation struct {
	// SubmitEach submits every SQE as soon as it is prepared, one
	// io_uring_enter each, instead of once per round for all of them.
	SubmitEach bool
	// ReapOne takes one completion per wake-up (it waits for one and
	// reaps one) instead of waiting for a batch and reaping them all.
	ReapOne bool
	// BatchWait makes a busy thread wait for a quarter of its backing
	// I/O in flight before it looks at new requests, as it did before
	// (threadLoop.waitFor), instead of waking for the first completion
	// while any request can arrive.
	BatchWait bool
	// TimedBatch is BatchWait with the wait bounded to timedBatchWait:
	// the other design of fairness, batches bounded in time rather
	// than none while requests can arrive.
	TimedBatch bool
	// RingOrder handles all of a round's completions in ring order, as
	// the thread did before fair rounds (threadLoop.dispatch): the light
	// queues' neither first nor submitted early, and the busy queues'
	// not bounded per round.
	RingOrder bool
	// ThreadNice runs the server threads at nice threadNice: a thread
	// that serves many devices competes for a CPU as one task against
	// every client of those devices, where the kernel loop driver's work
	// runs in a worker per device and in interrupts (a design measured
	// against the default).
	ThreadNice bool
	// PlainRing sets the ring up without SINGLE_ISSUER, DEFER_TASKRUN and
	// COOP_TASKRUN: completions run their task work, and wake the thread,
	// as they come, not when the thread waits for a batch. Idle buffer
	// reclaim, which relies on DEFER_TASKRUN, is off with it.
	PlainRing bool
	// Unbounded lifts the engine's bound on operations in flight (never
	// more than the completion ring holds) and gives the thread a ring
	// of unboundedCQ entries: the completions that do not fit go to the
	// kernel's overflow list, to be flushed by a later enter.
	Unbounded bool
	// NoFixedFiles names the char device and backing file by their fds
	// in every SQE instead of by registered file slots.
	NoFixedFiles bool
	// NoFixedBuffers does not register the copy-mode buffer heads:
	// every backing I/O pins its pages (QueueOptions.FixedBuffers off).
	NoFixedBuffers bool
	// HandOff sends every backing I/O to the kernel's worker threads
	// (IOSQE_ASYNC: io-wq) instead of issuing it from the server
	// thread: the worker-pool design, which the kernel loop driver
	// measured as a loss.
	HandOff bool
	// NoChangeTracking gives new and re-adopted devices no change record
	// (package cbt): their writes mark nothing, and every snapshot's
	// delta compares files. It measures what tracking costs the data
	// path, side by side with the default.
	NoChangeTracking bool
	// NoOffer never offers the thread to the Go scheduler before a
	// sleeping wait (threadLoop.offer): the runtime's monitor then
	// takes the thread's P in the middle of its waits instead.
	NoOffer bool
}

// ablations names each switch, as ParseAblation takes and String gives.
var ablations = []struct {
	name string
	on   func(*Ablation) *bool
}{
	{"submit-each", func(a *Ablation) *bool { return &a.SubmitEach }},
	{"reap-one", func(a *Ablation) *bool { return &a.ReapOne }},
	{"batch-wait", func(a *Ablation) *bool { return &a.BatchWait }},
	{"timed-batch", func(a *Ablation) *bool { return &a.TimedBatch }},
	{"ring-order", func(a *Ablation) *bool { return &a.RingOrder }},
	{"thread-nice", func(a *Ablation) *bool { return &a.ThreadNice }},
	{"plain-ring", func(a *Ablation) *bool { return &a.PlainRing }},
	{"unbounded", func(a *Ablation) *bool { return &a.Unbounded }},
	{"no-fixed-files", func(a *Ablation) *bool { return &a.NoFixedFiles }},
	{"no-fixed-buffers", func(a *Ablation) *bool { return &a.NoFixedBuffers }},
	{"hand-off", func(a *Ablation) *bool { return &a.HandOff }},
	{"no-change-tracking", func(a *Ablation) *bool { return &a.NoChangeTracking }},
	{"no-offer", func(a *Ablation) *bool { return &a.NoOffer }},
}

// ParseAblation parses a comma-separated list of ablation names ("" is
// none).
func ParseAblation(s string) (Ablation, error) {
	var a Ablation
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		found := false
		for _, ab := range ablations {
			if ab.name == name {
				*ab.on(&a) = true
				found = true
			}
		}
		if !found {
			return Ablation{}, fmt.Errorf("ablation %q: want a comma-separated list of %s: %w", name, strings.Join(AblationNames(), ", "), os.ErrInvalid)
		}
	}
	return a, nil
}

// String lists the switches that are on, as ParseAblation takes them.
func (a Ablation) String() string {
	var on []string
	for _, ab := range ablations {
		if *ab.on(&a) {
			on = append(on, ab.name)
		}
	}
	return strings.Join(on, ",")
}

// AblationNames lists every switch, as ParseAblation takes them.
func AblationNames() []string {
	names := make([]string, len(ablations))
	for i, ab := range ablations {
		names[i] = ab.name
	}
	return names
}

// The switches, as the server threads read them.
func (a Ablation) submitEach() bool     { return a.SubmitEach }
func (a Ablation) reapOne() bool        { return a.ReapOne }
func (a Ablation) batchWait() bool      { return a.BatchWait }
func (a Ablation) timedBatch() bool     { return a.TimedBatch }
func (a Ablation) ringOrder() bool      { return a.RingOrder }
func (a Ablation) threadNice() bool     { return a.ThreadNice }
func (a Ablation) plainRing() bool      { return a.PlainRing }
func (a Ablation) unbounded() bool      { return a.Unbounded }
func (a Ablation) noFixedFiles() bool   { return a.NoFixedFiles }
func (a Ablation) noFixedBuffers() bool { return a.NoFixedBuffers }
func (a Ablation) handOff() bool        { return a.HandOff }
func (a Ablation) noOffer() bool        { return a.NoOffer }

// TracksChanges says whether devices get a change record (package ublk
// asks it when it makes one).
func (a Ablation) TracksChanges() bool { return !a.NoChangeTracking }
