package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring/bench"
)

// runBench runs `csi-fastblk bench <what> [flags]`; args[0] names the
// benchmark.
func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("bench: missing benchmark name (engine or scale)")
	}
	switch args[0] {
	case "engine":
		return runBenchEngine(ctx, args[1:])
	case "scale":
		return runBenchScale(ctx, args[1:])
	}
	return fmt.Errorf("bench: unknown benchmark %q (want engine or scale)", args[0])
}

func runBenchEngine(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench engine", flag.ContinueOnError)
	a := benchEngineFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := a.cfg
	if cfg.File == "" {
		return fmt.Errorf("bench engine: --file is required")
	}
	var err error
	if cfg.Size, err = parseBenchSize(a.size); err != nil {
		return fmt.Errorf("bench engine: --size: %w", err)
	}
	n, err := parseBenchSize(a.bs)
	if err != nil {
		return fmt.Errorf("bench engine: --bs: %w", err)
	}
	cfg.BS = int(n)
	if cfg.Runtime, err = parseRuntime(a.runtime); err != nil {
		return fmt.Errorf("bench engine: --runtime: %w", err)
	}
	cfg.Direct, cfg.NoFixed = a.direct != 0, a.fixed == 0
	if cfg.Size > 0 {
		if err := bench.Layout(cfg.File, cfg.Size); err != nil {
			return err
		}
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if a.asJSON {
		return res.WriteJSON(os.Stdout)
	}
	res.Print(os.Stdout)
	return nil
}

// benchEngineArgs are the flags of `csi-fastblk bench engine`.
type benchEngineArgs struct {
	cfg               bench.Config
	size, bs, runtime string
	direct, fixed     int
	asJSON            bool
}

// benchEngineFlags declares the flags of `csi-fastblk bench engine`.
func benchEngineFlags(fs *flag.FlagSet) *benchEngineArgs {
	a := &benchEngineArgs{}
	fs.StringVar(&a.cfg.File, "file", "", "file to run on (created and written out to --size if smaller)")
	fs.StringVar(&a.size, "size", "0", "bytes of the file to use (k/m/g/t suffixes, binary); 0: the file's size")
	fs.StringVar(&a.cfg.RW, "rw", "randread", "read, write, randread or randwrite")
	fs.StringVar(&a.bs, "bs", "4k", "block size")
	fs.IntVar(&a.cfg.IODepth, "iodepth", 32, "I/Os in flight per job")
	fs.IntVar(&a.cfg.Jobs, "jobs", 1, "jobs (one locked thread and ring each)")
	fs.StringVar(&a.runtime, "runtime", "10s", "run time (a duration, or seconds)")
	fs.IntVar(&a.direct, "direct", 1, "1: O_DIRECT")
	fs.IntVar(&a.fixed, "fixed", 1, "1: registered file and buffers (READ_FIXED/WRITE_FIXED)")
	fs.IntVar(&a.cfg.WaitMin, "wait-min", 0, "min_complete per wait (0: iodepth/4)")
	fs.DurationVar(&a.cfg.Poll, "poll", 100*time.Microsecond, "check the rings this long before each sleeping wait (0: never)")
	fs.IntVar(&a.cfg.SubmitBatch, "submit-batch", 1, "prepared I/Os per io_uring_enter (0: all that are ready, with the wait)")
	fs.BoolVar(&a.cfg.NoRandomMap, "norandommap", false, "random offsets drawn uniformly, repeats included (fio's --norandommap); default: each block once per pass, as fio")
	fs.BoolVar(&a.asJSON, "json", false, "print one JSON object instead of text")
	return a
}

// parseBenchSize parses 4096, 4k, 1G (binary multiples, as fio does).
func parseBenchSize(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(s, "b"), "i")))
	mult := int64(1)
	if i := strings.IndexAny(s, "kmgt"); i >= 0 && i == len(s)-1 {
		mult = map[byte]int64{'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}[s[i]]
		s = s[:i]
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}

// parseRuntime accepts a Go duration or a number of seconds.
func parseRuntime(s string) (time.Duration, error) {
	if v, err := strconv.Atoi(s); err == nil {
		return time.Duration(v) * time.Second, nil
	}
	return time.ParseDuration(s)
}
