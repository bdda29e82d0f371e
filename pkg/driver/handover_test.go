package driver

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestHandOverEndsWaitingCalls: once the plugin stops (HandOver, which
// keeps the volumes' locks for good), a call waiting for a volume fails
// with Unavailable instead of waiting for ever; the call that held the
// lock finishes as it would.
func TestHandOverEndsWaitingCalls(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNode(t, t.TempDir())
	unlock, err := n.d.lockVolume(ctx, "v1") // a call in flight
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	waiting := make(chan error, 1)
	go func() {
		unlock, err := n.d.lockVolume(ctx, "v1")
		if err == nil {
			unlock()
		}
		waiting <- err
	}()
	if err := n.d.HandOver(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("the waiting call: %v, want Unavailable", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting call still waits a minute after the stop")
	}
	if _, err := n.d.lockVolume(ctx, "v2"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call after the stop: %v, want Unavailable", err)
	}
}
