package uring

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNewFlags(t *testing.T) {
	lockThread(t)
	cases := []struct {
		name  string
		cfg   Config
		must  uint32 // flags that must have taken on this kernel
		shift uint
	}{
		{"plain", Config{Entries: 8}, IORING_SETUP_CQSIZE, 6},
		{"queue", Config{Entries: 64, CQEntries: 256, Flags: QueueFlags}, 0, 6},
		{"control sqe128", Config{Entries: 32, Flags: IORING_SETUP_SQE128}, IORING_SETUP_SQE128, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lockThread(t)
			r := newRing(t, c.cfg)
			if r.Flags()&c.must != c.must {
				t.Errorf("flags %#x lack %#x", r.Flags(), c.must)
			}
			if r.sqeShift != c.shift {
				t.Errorf("sqe shift %d, want %d", r.sqeShift, c.shift)
			}
			want := c.cfg.CQEntries
			if want == 0 {
				want = 2 * c.cfg.Entries
			}
			if r.SQEntries() != c.cfg.Entries || r.CQEntries() != want {
				t.Errorf("sizes sq %d cq %d", r.SQEntries(), r.CQEntries())
			}
			if c.cfg.Flags == QueueFlags && HaveDeferTaskrun() == nil && r.Flags()&QueueFlags != QueueFlags {
				t.Errorf("kernel has DEFER_TASKRUN but ring got flags %#x", r.Flags())
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"zero entries", Config{}},
		{"too many", Config{Entries: 65536}},
		{"cq smaller than sq", Config{Entries: 64, CQEntries: 8}},
		{"sqpoll", Config{Entries: 8, Flags: IORING_SETUP_SQPOLL}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(c.cfg)
			if err == nil {
				r.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, unix.EINVAL) {
				t.Errorf("error %v does not wrap EINVAL", err)
			}
		})
	}
}

func TestCloseIdempotent(t *testing.T) {
	lockThread(t)
	r, err := New(Config{Entries: 4, Flags: QueueFlags})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterRingFD(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := r.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i, err)
		}
	}
	if _, err := r.Submit(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Submit after Close: %v", err)
	}
	if err := r.RegisterFiles([]int32{0}); !errors.Is(err, os.ErrClosed) {
		t.Errorf("RegisterFiles after Close: %v", err)
	}
	if r.GetSQE() != nil || r.Reap(make([]CQE, 1)) != 0 {
		t.Error("GetSQE/Reap work after Close")
	}
}

func TestNop(t *testing.T) {
	lockThread(t)
	for _, regFD := range []bool{false, true} {
		name := map[bool]string{false: "fd", true: "registered ring fd"}[regFD]
		t.Run(name, func(t *testing.T) {
			lockThread(t)
			r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
			if regFD {
				if err := r.RegisterRingFD(); err != nil {
					t.Fatal(err)
				}
			}
			s := r.GetSQE()
			s.PrepNop()
			s.UserData = 0xdeadbeefcafe
			c := waitOne(t, r)
			if c.UserData != 0xdeadbeefcafe || c.Res != 0 {
				t.Errorf("cqe %+v", c)
			}
			if r.InFlight() != 0 {
				t.Errorf("in flight %d after reap", r.InFlight())
			}
		})
	}
}

// TestUnregisterRingFD proves that a ring whose fd was registered and then
// unregistered is entered through its fd again: a NOP still completes.
func TestUnregisterRingFD(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	if err := r.RegisterRingFD(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterRingFD(); err != nil {
		t.Fatal(err)
	}
	if r.enterFD != r.fd || r.enterFlags != 0 {
		t.Fatalf("after UnregisterRingFD: enter fd %d (ring fd %d), flags %#x", r.enterFD, r.fd, r.enterFlags)
	}
	s := r.GetSQE()
	s.PrepNop()
	s.UserData = 7
	if c := waitOne(t, r); c.UserData != 7 || c.Res != 0 {
		t.Errorf("cqe %+v", c)
	}
}

func TestProbes(t *testing.T) {
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"SQE128", HaveSQE128},
		{"CoopTaskrun", HaveCoopTaskrun},
		{"SingleIssuer", HaveSingleIssuer},
		{"DeferTaskrun", HaveDeferTaskrun},
		{"URingCmd", HaveURingCmd},
		{"Read", func() error { return HaveOp(IORING_OP_READ) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Every probe's feature is in 6.1; this machine runs newer.
			if err := c.fn(); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		})
	}
	if err := HaveOp(255); !errors.Is(err, ErrNotSupported) {
		t.Errorf("opcode 255: %v, want ErrNotSupported", err)
	}
}

// TestUnsubmitted proves that Unsubmitted counts prepared SQEs until the
// kernel consumes them, those waiting for ring room included.
func TestUnsubmitted(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 2, Flags: QueueFlags})
	for i := range 5 {
		s := r.GetSQE()
		if s == nil {
			t.Fatalf("no sqe for nop %d", i)
		}
		s.PrepNop()
	}
	if n := r.Unsubmitted(); n != 5 {
		t.Fatalf("Unsubmitted = %d after preparing 5, want 5", n)
	}
	for done := 0; done < 5; {
		if _, err := r.SubmitAndWait(1, 0); err != nil {
			t.Fatal(err)
		}
		done += r.Reap(make([]CQE, 8))
	}
	if n := r.Unsubmitted(); n != 0 {
		t.Fatalf("Unsubmitted = %d after all completed, want 0", n)
	}
}

// TestSetMaxWorkers checks that the cap reaches the kernel: the next call,
// with zeros (leave unchanged), reads the bounded cap back, and the
// unbounded one stays as it was.
func TestSetMaxWorkers(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	before, err := r.SetMaxWorkers(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetMaxWorkers(3, 0); err != nil {
		t.Fatal(err)
	}
	after, err := r.SetMaxWorkers(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after[0] != 3 || after[1] != before[1] {
		t.Fatalf("io-wq caps after SetMaxWorkers(3, 0) = %v, want [3 %d] (before: %v)", after, before[1], before)
	}
}

// TestRawEnterOnlyWithoutTaskWork pins which enters keep their P: a
// GETEVENTS enter runs a DEFER_TASKRUN ring's task work, which may fault
// and sleep, so it must release the P even when it waits for nothing
// (before: every enter with minComplete 0 went through RawSyscall6,
// Reap's GETEVENTS flush among them).
func TestRawEnterOnlyWithoutTaskWork(t *testing.T) {
	for _, c := range []struct {
		min, flags uint32
		raw        bool
	}{
		{0, 0, true},
		{0, IORING_ENTER_SQ_WAKEUP, true},
		{0, IORING_ENTER_GETEVENTS, false},
		{0, IORING_ENTER_GETEVENTS | IORING_ENTER_REGISTERED_RING, false},
		{1, IORING_ENTER_GETEVENTS, false},
		{1, 0, false},
	} {
		if got := rawEnter(c.min, c.flags); got != c.raw {
			t.Errorf("rawEnter(%d, %#x) = %v, want %v", c.min, c.flags, got, c.raw)
		}
	}
}
