package dataplane

// A server thread's io-wq runs the backing operations io_uring cannot issue
// without blocking (writes into holes or over a stale mtime, fsync,
// fallocate). It belongs to the thread, so every device the thread serves
// shares its bounded workers, and the kernel caps them at 4 per CPU: one
// device whose backing file stalls (its filesystem frozen, its inode locked
// by a clone) could hold them all, and the punted operations of every other
// device would wait for it. The thread therefore allows, on top of the
// kernel's cap, as many workers as its deepest queue has tags: a stalled
// queue holds at most its own requests' workers, and the others keep the
// kernel's share. It does not lift the cap further, as one worker per tag
// would: under a flood of first writes into sparse volumes that many
// workers only compete with the server threads for the CPUs
// (docs/benchmark-studies.md).

// iowqCap is the thread's io-wq bounded-worker cap and the kernel's own,
// which it grows from; base 0 means fixed by ThreadConfig.IOWQWorkers.
type iowqCap struct {
	base, cur uint32
}

// initIOWQ applies ThreadConfig.IOWQWorkers, or reads the kernel's cap to
// grow from. It runs on the thread: io-wq is per task.
func (s *threadLoop) initIOWQ() error {
	if n := s.t.cfg.IOWQWorkers; n > 0 {
		_, err := s.ring.SetMaxWorkers(n, 0)
		return err
	}
	cur, err := s.ring.SetMaxWorkers(0, 0) // 0 changes nothing: a read
	if err != nil {
		return err
	}
	s.iowq = iowqCap{base: cur[0], cur: cur[0]}
	return nil
}

// sizeIOWQ sets the cap for the queues attached now: the kernel's cap plus
// the depth of the deepest. A refusal leaves the cap as it was: the thread
// serves on, only less isolated.
func (s *threadLoop) sizeIOWQ() {
	if s.iowq.base == 0 {
		return
	}
	deepest := uint32(0)
	for _, l := range s.slots {
		if l != nil {
			deepest = max(deepest, uint32(l.cfg.Depth))
		}
	}
	want := s.iowq.base + deepest
	if want == s.iowq.cur {
		return
	}
	if _, err := s.ring.SetMaxWorkers(want, 0); err == nil {
		s.iowq.cur = want
	}
}
