//go:build failpoint

package dataplane

import "testing"

// injectEAGAIN makes the next n backing completions of q read -EAGAIN
// (Queue.FaultEAGAIN).
func injectEAGAIN(t *testing.T, q *Queue, n int32) {
	t.Helper()
	q.FaultEAGAIN(n)
}

// eagainLeft is how many injected -EAGAIN answers are still to come.
func (q *Queue) eagainLeft() int32 { return q.FaultsLeft() }

// failThread makes th fail at its next round (FailThread).
func failThread(t *testing.T, th *Thread) (stop func()) {
	t.Helper()
	return FailThread(th)
}
