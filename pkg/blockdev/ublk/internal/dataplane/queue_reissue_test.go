//go:build failpoint

package dataplane

import (
	"bytes"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// TestLoopRetryKeepsTheDeviceBusy serves a write whose backing operation
// is refused with -EAGAIN three times and a read likewise: the queue's
// count of backing operations in flight, which Pause waits to read zero
// (Queue.Settled), must stay above zero from the first issue to the last
// completion of each, since the retries are still to be issued. Before,
// it fell to zero before each retry (four times per request, not once).
func TestLoopRetryKeepsTheDeviceBusy(t *testing.T) {
	l, _ := hostLoop(t, 4, TargetFile)
	copy(l.bufs.slice(1), bytes.Repeat([]byte("retried\n"), 512))
	for i, op := range []uint32{uapi.IOOpWrite, uapi.IOOpRead} {
		injectEAGAIN(t, l.q, 3)
		setDesc(l, 1, op, 8, 8)
		if attempts := serveCounting(t, l, 1); attempts != 4 {
			t.Fatalf("op %d: %d backing attempts, want 4", op, attempts)
		}
		if got, want := l.q.BackingIdles(), int32(i+1); got != want {
			t.Fatalf("op %d: the backing count fell to zero %d times in all, want %d (once per request)", op, got, want)
		}
	}
	if st := l.statsNow(); st.Errors != 0 || st.Writes != 1 || st.Reads != 1 {
		t.Fatalf("stats = %+v", st)
	}
}
