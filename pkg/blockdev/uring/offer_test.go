package uring

import (
	"testing"
	"time"
)

// TestOfferDue pins the pacing of a ring thread's offers to the Go
// scheduler: none within OfferInterval of the last one, one from then on.
func TestOfferDue(t *testing.T) {
	iv := OfferInterval
	for _, c := range []struct {
		since time.Duration
		want  bool
	}{{0, false}, {iv / 2, false}, {iv - 1, false}, {iv, true}, {10 * iv, true}} {
		if got := OfferDue(c.since); got != c.want {
			t.Errorf("OfferDue(%v) = %v, want %v", c.since, got, c.want)
		}
	}
}
