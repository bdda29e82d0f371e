package uring

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Submissions the kernel does not take whole. Two real ways to get one on
// any kernel:
//
//   - An SQE that fails at submission (an unknown opcode) ends the kernel's
//     batch: io_submit_sqes consumes it, posts its error CQE, leaves the
//     SQEs after it in the SQ, returns the short count and skips the wait
//     (io_uring/io_uring.c, io_submit_sqes and io_uring_enter@v6.18).
//   - EAGAIN or EBUSY with nothing consumed. Kernels return them when they
//     cannot allocate requests or (before 5.19, and without
//     IORING_FEAT_NODROP) when the CQ overflows; 6.18 keeps overflowed CQEs
//     on a list instead, so the tests make io_uring_enter answer them
//     through a seccomp user-notification filter on the ring's thread.

// TestSubmitStopsAtFailedSQE: a batch whose second SQE fails at submission
// still completes every SQE in one SubmitAndWait, which waits only for what
// the kernel holds.
func TestSubmitStopsAtFailedSQE(t *testing.T) {
	res := onRingThread(t, Config{Entries: 8, Flags: QueueFlags}, nil, func(r *Ring) error {
		for i := range 4 {
			s := r.GetSQE()
			s.PrepNop()
			if i == 1 {
				s.Opcode = 0xfe // no such op: EINVAL at submission
			}
			s.UserData = uint64(i)
		}
		n, err := r.SubmitAndWait(4, 0) // no timeout: the engine must not wait for SQEs still in the SQ
		if err != nil {
			return fmt.Errorf("SubmitAndWait: %w", err)
		}
		if n != 4 || r.Unsubmitted() != 0 {
			return fmt.Errorf("submitted %d, %d left, want 4 and 0", n, r.Unsubmitted())
		}
		return reapAll(r, 4, map[uint64]int32{1: -int32(unix.EINVAL)})
	})
	if res != nil {
		t.Fatal(res)
	}
}

// TestSubmitRefusedRetries: the kernel refuses the first three submissions
// (EAGAIN, EBUSY, EAGAIN); SubmitAndWait keeps the SQEs, retries after short
// timed waits and returns with everything submitted and complete.
func TestSubmitRefusedRetries(t *testing.T) {
	refuse := []unix.Errno{unix.EAGAIN, unix.EBUSY, unix.EAGAIN}
	f := &refuser{errs: refuse}
	start := time.Now()
	err := onRingThread(t, Config{Entries: 8, Flags: QueueFlags}, f, func(r *Ring) error {
		for range 3 {
			r.GetSQE().PrepNop()
		}
		n, err := r.SubmitAndWait(3, 0)
		if err != nil {
			return fmt.Errorf("SubmitAndWait: %w", err)
		}
		if n != 3 || r.Unsubmitted() != 0 {
			return fmt.Errorf("submitted %d, %d left, want 3 and 0", n, r.Unsubmitted())
		}
		return reapAll(r, 3, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.refused.Load(); got != int32(len(refuse)) {
		t.Errorf("kernel refused %d submissions, want %d", got, len(refuse))
	}
	t.Logf("%d refusals retried in %v", len(refuse), time.Since(start))
}

// TestSubmitRefusedBounded: a kernel that refuses every submission makes
// SubmitAndWait return an error matching the errno within the refusal
// limit, not wait for completions that cannot come; the SQEs stay queued
// and go in once the kernel takes them again. A refusal while CQEs wait in
// the CQ returns at once, so that the caller reaps them.
func TestSubmitRefusedBounded(t *testing.T) {
	f := &refuser{}
	f.all.Store(int32(unix.EAGAIN))
	err := onRingThread(t, Config{Entries: 8, Flags: QueueFlags}, f, func(r *Ring) error {
		r.GetSQE().PrepNop()
		r.GetSQE().PrepNop()
		start := time.Now()
		n, err := r.SubmitAndWait(2, 0)
		el := time.Since(start)
		if !errors.Is(err, unix.EAGAIN) || n != 0 {
			return fmt.Errorf("SubmitAndWait under refusal: %d, %v; want 0 and EAGAIN", n, err)
		}
		if el > refusedLimit+time.Second {
			return fmt.Errorf("refusal reported after %v, limit %v", el, refusedLimit)
		}
		if r.Unsubmitted() != 2 || r.InFlight() != 0 {
			return fmt.Errorf("after refusal: %d unsubmitted, %d in flight; want 2 and 0", r.Unsubmitted(), r.InFlight())
		}

		f.all.Store(0) // the kernel takes submissions again
		if n, err := r.SubmitAndWait(2, 0); n != 2 || err != nil {
			return fmt.Errorf("SubmitAndWait after refusal: %d, %v", n, err)
		}

		f.all.Store(int32(unix.EBUSY)) // and refuses again, with two CQEs unreaped
		r.GetSQE().PrepNop()
		start = time.Now()
		if n, err := r.SubmitAndWait(1, 0); n != 0 || err != nil || r.Unsubmitted() != 1 {
			return fmt.Errorf("refused with CQEs ready: %d, %v, %d unsubmitted; want 0, nil, 1", n, err, r.Unsubmitted())
		}
		if el := time.Since(start); el > refusedWaitMax {
			return fmt.Errorf("refused with CQEs ready: returned after %v, want at once", el)
		}
		f.all.Store(0)
		return reapAll(r, 3, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSubmitRefusedTimed: under refusal a timed SubmitAndWait (what every
// ublk control command uses) ends at its own timeout with ETIME, not at
// the refusal limit, and keeps the SQE for a later call.
func TestSubmitRefusedTimed(t *testing.T) {
	f := &refuser{}
	f.all.Store(int32(unix.EAGAIN))
	err := onRingThread(t, Config{Entries: 4, Flags: IORING_SETUP_SQE128}, f, func(r *Ring) error {
		r.GetSQE().PrepNop()
		const timeout = 200 * time.Millisecond
		start := time.Now()
		n, err := r.SubmitAndWait(1, timeout)
		el := time.Since(start)
		if !errors.Is(err, unix.ETIME) || n != 0 || r.Unsubmitted() != 1 {
			return fmt.Errorf("timed wait under refusal: %d, %v, %d unsubmitted; want 0, ETIME, 1", n, err, r.Unsubmitted())
		}
		if el < timeout || el > timeout+refusedWaitMax+100*time.Millisecond {
			return fmt.Errorf("timed wait under refusal returned after %v, timeout %v", el, timeout)
		}
		f.all.Store(0)
		return reapAll(r, 1, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// onRingThread creates a ring on a fresh locked thread, installs f (if
// any) on that thread, runs fn and returns its error. It fails the test
// when fn does not return within 10s: the defect this guards against is a
// wait that never ends. The thread exits with the goroutine, taking the
// filter with it.
func onRingThread(t *testing.T, cfg Config, f *refuser, fn func(*Ring) error) error {
	t.Helper()
	// A refused enter that waits for nothing blocks in the filter while
	// holding its P (RawSyscall6): the supervisor needs another.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its filter
		r, err := New(cfg)
		if err != nil {
			done <- err
			return
		}
		defer r.Close()
		if f != nil {
			if err := f.install(); err != nil {
				done <- err
				return
			}
		}
		done <- fn(r)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("hung: the ring's thread did not return within 10s")
		return nil
	}
}

// reapAll reaps n CQEs within 10s and checks their results: 0 unless res
// names another.
func reapAll(r *Ring, n int, res map[uint64]int32) error {
	cqes := make([]CQE, 16)
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for got < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("reaped %d of %d CQEs", got, n)
		}
		if _, err := r.SubmitAndWait(1, time.Second); err != nil && !errors.Is(err, unix.ETIME) {
			return err
		}
		for _, c := range cqes[:r.Reap(cqes)] {
			if c.Res != res[c.UserData] {
				return fmt.Errorf("cqe %d: res %d, want %d", c.UserData, c.Res, res[c.UserData])
			}
			got++
		}
	}
	if r.InFlight() != 0 {
		return fmt.Errorf("%d still in flight after all CQEs", r.InFlight())
	}
	return nil
}

// refuser makes io_uring_enter calls that submit (to_submit != 0) on one
// thread fail with errs in turn, then with all while it is set, and
// otherwise pass, through a seccomp filter whose SECCOMP_RET_USER_NOTIF
// answers a supervisor goroutine gives. Waits (to_submit 0) always pass.
type refuser struct {
	errs []unix.Errno
	all  atomic.Int32 // an errno, 0 = pass

	refused  atomic.Int32
	listener int
}

// seccompData, seccompNotif and seccompNotifResp are struct seccomp_data,
// seccomp_notif and seccomp_notif_resp (include/uapi/linux/seccomp.h).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// auditArch is this build's AUDIT_ARCH_* value for the filter's arch check.
func auditArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("seccomp test filter: no audit arch for %s", runtime.GOARCH)
}

// install loads the filter on the calling (locked) thread and starts the
// supervisor.
func (f *refuser) install() error {
	arch, err := auditArch()
	if err != nil {
		return err
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldAbs, K: 4}, // arch
		{Code: jeq, K: arch, Jf: 5},
		{Code: ldAbs, K: 0}, // nr
		{Code: jeq, K: unix.SYS_IO_URING_ENTER, Jf: 3},
		{Code: ldAbs, K: 16 + 8}, // args[1] (to_submit), low half
		{Code: jeq, K: 0, Jt: 1},
		{Code: ret, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	f.listener = int(fd)
	go f.supervise()
	return nil
}

// supervise answers the filter's notifications until no thread uses it
// (the ring's thread has exited).
func (f *refuser) supervise() {
	defer unix.Close(f.listener)
	i := 0
	for {
		fds := []unix.PollFd{{Fd: int32(f.listener), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 100); err != nil && err != unix.EINTR {
			return
		}
		if fds[0].Revents&unix.POLLHUP != 0 {
			return
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			continue
		}
		var n seccompNotif
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(f.listener), unix.SECCOMP_IOCTL_NOTIF_RECV,
			uintptr(unsafe.Pointer(&n))); errno != 0 {
			continue // the caller went away (ENOENT) or a signal: poll again
		}
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		e := unix.Errno(f.all.Load())
		if i < len(f.errs) {
			e = f.errs[i]
			i++
		}
		if e != 0 {
			resp = seccompNotifResp{ID: n.ID, Error: -int32(e)}
			f.refused.Add(1)
		}
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(f.listener), unix.SECCOMP_IOCTL_NOTIF_SEND,
			uintptr(unsafe.Pointer(&resp)))
	}
}
