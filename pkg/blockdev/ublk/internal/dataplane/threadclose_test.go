package dataplane

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestClosedRingKeepsItsQueuesBuffersWhileItLives proves that a thread's
// close unmaps its copy-mode queues' buffers only once the kernel has freed
// the ring (issue 43 defect 2). A ring outlives the close of its fd while it
// has operations in flight, and a queued read or write that is not of a
// fixed buffer resolves its address only when an io-wq worker runs it: a
// new mapping at the same address (another volume's buffers) would take or
// give that volume's data. Here a second fd of the ring holds it alive, as
// such an operation would.
func TestClosedRingKeepsItsQueuesBuffersWhileItLives(t *testing.T) {
	s := hostThread(t, QueueCost(4), 1)
	l, _ := hostQueue(t, s, 4, TargetFile)
	mem := l.bufs.mem
	hold, err := unix.Dup(s.ring.FD())
	if err != nil {
		t.Fatal(err)
	}
	s.close(ErrThreadDead)
	if !mapped(mem) {
		unix.Close(hold)
		t.Fatal("the queue's buffers were unmapped while its ring still lived")
	}
	unix.Close(hold) // the last reference: the kernel frees the ring
	for deadline := time.Now().Add(10 * time.Second); mapped(mem); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queue's buffers were still mapped 10 s after its ring was freed")
		}
	}
}

// mapped reports whether every page of mem is mapped (mincore answers
// ENOMEM for an unmapped page).
func mapped(mem []byte) bool {
	vec := make([]byte, (len(mem)+unix.Getpagesize()-1)/unix.Getpagesize())
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
	return !errors.Is(e, unix.ENOMEM)
}
