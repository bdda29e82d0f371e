package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Config describes one benchmark run (fio terms).
type Config struct {
	File    string
	Size    int64 // bytes of File to use; 0 means its current size
	RW      string
	BS      int
	IODepth int
	Jobs    int
	Runtime time.Duration
	Direct  bool
	// WaitMin is the min_complete of each wait; 0 picks IODepth/4 (a
	// batch, at least 1).
	WaitMin int
	// SubmitBatch is how many prepared I/Os go to the kernel per
	// io_uring_enter: 1 (the default) submits each one as soon as its
	// slot is free; 0 submits all that are ready, with the wait. On a
	// latency-bound disk the first is faster: more than two SQEs per
	// enter make io_uring plug the block queue until the whole batch is
	// issued, which delays the first I/O of every batch.
	SubmitBatch int
	// Poll, when positive, checks the rings for completions this long
	// before each wait sleeps in io_uring_enter (the command's default is
	// 100us: a sleep and wake-up per batch cost a noticeable share of 4k
	// random-write IOPS on a disk fast enough that fio never sleeps;
	// docs/benchmark-studies.md, "Figures behind code comments").
	Poll time.Duration
	// NoFixed disables registered files and buffers (plain READ/WRITE).
	NoFixed bool
	// NoRandomMap draws random offsets uniformly, repeats included, as
	// fio's --norandommap; by default each job visits every block once per
	// pass, as fio does by default.
	NoRandomMap bool
}

// Result is what a run measured, summed over jobs.
type Result struct {
	Config  Config
	IOs     uint64
	Bytes   uint64
	Elapsed time.Duration
	Enters  uint64 // io_uring_enter calls made by the jobs
	VolCS   int64  // voluntary context switches of the process
	InvolCS int64  // involuntary context switches of the process
	Lat     hist
}

// IOPS returns I/Os per second.
func (r *Result) IOPS() float64 { return float64(r.IOs) / r.Elapsed.Seconds() }

// BW returns bytes per second.
func (r *Result) BW() float64 { return float64(r.Bytes) / r.Elapsed.Seconds() }

// Percentile returns the completion latency at quantile q.
func (r *Result) Percentile(q float64) time.Duration { return r.Lat.percentile(q) }

func (c *Config) validate() error {
	switch c.RW {
	case "read", "write", "randread", "randwrite":
	default:
		return fmt.Errorf("bench: rw %q not one of read, write, randread, randwrite", c.RW)
	}
	if c.BS <= 0 || c.BS%512 != 0 {
		return fmt.Errorf("bench: bs %d is not a positive multiple of 512", c.BS)
	}
	if c.IODepth < 1 || c.IODepth > 4096 || c.Jobs < 1 || c.Jobs > 256 {
		return fmt.Errorf("bench: iodepth %d or jobs %d out of range", c.IODepth, c.Jobs)
	}
	if c.Runtime <= 0 {
		return fmt.Errorf("bench: runtime %v must be positive", c.Runtime)
	}
	if c.WaitMin <= 0 {
		c.WaitMin = max(1, c.IODepth/4)
	}
	c.WaitMin = min(c.WaitMin, c.IODepth)
	if c.SubmitBatch < 0 {
		return fmt.Errorf("bench: submit batch %d is negative", c.SubmitBatch)
	}
	return nil
}

// Run runs the benchmark; ctx cancels it early.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Size == 0 {
		var st unix.Stat_t
		if err := unix.Stat(cfg.File, &st); err != nil {
			return nil, fmt.Errorf("bench: stat %s: %w", cfg.File, err)
		}
		cfg.Size = st.Size
	}
	if cfg.Size < int64(cfg.BS) {
		return nil, fmt.Errorf("bench: %s: size %d smaller than bs %d", cfg.File, cfg.Size, cfg.BS)
	}
	var stop atomic.Bool
	ctx, cancel := context.WithTimeout(ctx, cfg.Runtime)
	defer cancel()
	go func() { <-ctx.Done(); stop.Store(true) }()

	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	jobs := make([]*job, cfg.Jobs)
	errs := make([]error, cfg.Jobs)
	var wg sync.WaitGroup
	for i := range jobs {
		jobs[i] = &job{cfg: &cfg, id: i, stop: &stop}
		wg.Go(func() { errs[i] = jobs[i].run() })
	}
	wg.Wait()
	elapsed := time.Since(start)
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res := &Result{Config: cfg, Elapsed: elapsed,
		VolCS: ru1.Nvcsw - ru0.Nvcsw, InvolCS: ru1.Nivcsw - ru0.Nivcsw}
	for _, j := range jobs {
		res.IOs += j.ios
		res.Enters += j.enters
		res.Lat.merge(&j.lat)
	}
	res.Bytes = res.IOs * uint64(cfg.BS)
	return res, nil
}
