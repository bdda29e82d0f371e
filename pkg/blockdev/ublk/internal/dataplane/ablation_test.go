//go:build ablation

package dataplane

import (
	"errors"
	"os"
	"testing"
)

// TestParseAblation proves the benchmark switches parse by name, print back
// the same way, and that a misspelt one is refused rather than ignored (an
// ablation run that silently measured the product would mislead).
func TestParseAblation(t *testing.T) {
	a, err := ParseAblation(" submit-each,hand-off ,")
	if err != nil {
		t.Fatal(err)
	}
	if !a.SubmitEach || !a.HandOff || a.ReapOne || a.PlainRing {
		t.Fatalf("parsed %+v", a)
	}
	if got := a.String(); got != "submit-each,hand-off" {
		t.Fatalf("String() = %q", got)
	}
	if a, err := ParseAblation(""); err != nil || a != (Ablation{}) {
		t.Fatalf("empty list: %+v, %v", a, err)
	}
	for _, ab := range ablations {
		a, err := ParseAblation(ab.name)
		if err != nil || a.String() != ab.name {
			t.Errorf("%s: %+v, %v", ab.name, a, err)
		}
	}
	if _, err := ParseAblation("submit-each,reap-two"); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("unknown name: %v, want ErrInvalid", err)
	}
}

// TestWaitForNewsAblated pins the wait of the batch-wait and timed-batch
// ablations while requests can arrive: the quarter of the backing I/O, as
// before the wait for news (TestWaitForNews).
func TestWaitForNewsAblated(t *testing.T) {
	for _, ab := range []Ablation{{BatchWait: true}, {TimedBatch: true}} {
		s := &threadLoop{parked: 32, backing: 256, ab: ab}
		if got := s.waitFor(); got != 64 {
			t.Errorf("%s: waitFor = %d, want 64", ab, got)
		}
	}
}
