package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/owner"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// runUblk implements `csi-fastblk ublk serve|features|list`.
func runUblk(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("ublk: want serve, features or list")
	}
	switch args[0] {
	case "serve":
		return ublkServe(ctx, args[1:])
	case "features":
		return ublkFeatures()
	case "list":
		return ublkList(args[1:])
	}
	return fmt.Errorf("ublk: unknown command %q (want serve, features or list)", args[0])
}

// ublkServe serves one file (or a null device) until SIGINT/SIGTERM, then
// removes the device. Used by the VM benchmarks.
func ublkServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ublk serve", flag.ContinueOnError)
	a := ublkServeFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	mode, err := ublk.ParseMode("--zero-copy", a.zeroCopy)
	if err != nil {
		return err
	}
	nowaitMode, err := ublk.ParseMode("--nowait-writes", a.nowait)
	if err != nil {
		return err
	}
	batchMode, err := ublk.ParseMode("--batch-io", a.batchIO)
	if err != nil {
		return err
	}
	ucMode, err := ublk.ParseMode("--user-copy", a.userCopy)
	if err != nil {
		return err
	}
	if a.maxIO > ublk.ZeroCopyMaxIOBytes {
		return fmt.Errorf("ublk serve: --max-io %d: at most %d", a.maxIO, ublk.ZeroCopyMaxIOBytes)
	}
	if (a.file == "") == !a.null {
		return errors.New("ublk serve: give exactly one of --file or --null")
	}
	if a.file != "" {
		// The device's state records the backing file by absolute path.
		abs, err := filepath.Abs(a.file)
		if err != nil {
			return fmt.Errorf("ublk serve: --file: %w", err)
		}
		a.file = abs
	}
	size, err := parseSize(a.size)
	if err != nil {
		return err
	}
	if a.cpuProfile != "" {
		f, err := os.Create(a.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	stateDir, err := os.MkdirTemp("", "csi-fastblk-ublk-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stateDir)
	srv, _, err := ublk.NewServer(ctx, ublk.ServerConfig{StateDir: stateDir, ZeroCopy: mode, UserCopy: ucMode, BatchIO: batchMode, NowaitWrites: nowaitMode, Queue: a.queue,
		Threads: a.threads, ThreadPolicy: ublk.ThreadPolicy(a.policy), Thread: a.thread})
	if err != nil {
		return err
	}
	defer srv.Close()
	id := fmt.Sprintf("serve-%d", os.Getpid())
	s, err := srv.Attach(ctx, ublk.AttachSpec{VolumeID: id, File: a.file, SizeBytes: size, Queues: a.queues, Depth: a.depth, MaxIOBytes: uint32(a.maxIO), Null: a.null})
	if err != nil {
		return err
	}
	fmt.Printf("device %s\n", s.Path)
	fmt.Printf("tuning queues=%d depth=%d max_io=%d copy=%s nowait_writes=%v flags=%s\n", s.Tuning.Queues, s.Tuning.Depth,
		s.Tuning.MaxIOBytes, s.Tuning.CopyMode(), s.NowaitWrites, ublk.FormatFlags(s.Flags))
	<-ctx.Done()
	if total, _, ok := srv.Stats(id); ok {
		fmt.Printf("queues (all): %+v\n", total)
	}
	if p := srv.Threads(); p != nil {
		for _, t := range p.Stats() {
			fmt.Printf("thread %d: queues=%d enters=%d rounds=%d cqes=%d\n", t.ID, t.Queues, t.Enters, t.Rounds, t.CQEs)
		}
	}
	return srv.Detach(context.WithoutCancel(ctx), id)
}

// ublkServeArgs are the flags of `csi-fastblk ublk serve`.
type ublkServeArgs struct {
	file, size, zeroCopy, userCopy, batchIO, nowait, cpuProfile, policy string
	queues, depth, threads                                              int
	maxIO                                                               uint
	null                                                                bool
	queue                                                               ublk.QueueOptions
	thread                                                              ublk.ThreadConfig
}

// ublkServeFlags declares the flags of `csi-fastblk ublk serve`.
func ublkServeFlags(fs *flag.FlagSet) *ublkServeArgs {
	a := &ublkServeArgs{}
	fs.StringVar(&a.file, "file", "", "backing file to serve")
	fs.IntVar(&a.queues, "queues", 0, "hardware queues (0 = tuning policy)")
	fs.IntVar(&a.depth, "depth", 0, "queue depth, a power of two (0 = tuning policy)")
	fs.StringVar(&a.zeroCopy, "zero-copy", "auto", "zero copy: auto, on or off")
	fs.StringVar(&a.userCopy, "user-copy", "auto", "without zero copy, copy through /dev/ublkcN (USER_COPY, Linux 6.5+) instead of the kernel's copy mode: auto, on or off")
	fs.StringVar(&a.batchIO, "batch-io", "off", "fetch and commit requests in batches (UBLK_F_BATCH_IO, Linux 7.0+): auto (where offered), on or off")
	fs.BoolVar(&a.null, "null", false, "serve a null device (benchmarks only; no data is kept)")
	fs.StringVar(&a.size, "size", "", "device size for --null (e.g. 4G), or to serve less than the whole file")
	fs.UintVar(&a.maxIO, "max-io", 0, "copy mode: largest request in bytes, a multiple of 4096 (0 = tuning policy)")
	fs.StringVar(&a.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.IntVar(&a.threads, "threads", 0, "server threads shared by the device's queues (0 = one per CPU); with --thread-policy device, the pool's bound")
	fs.StringVar(&a.policy, "thread-policy", "", "how the device gets server threads: shared or device (default: the plugin's)")
	fs.BoolVar(&a.queue.FixedBuffers, "fixed-buffers", true, "copy mode: register (and so pin) the head of every tag buffer at start")
	fs.DurationVar(&a.queue.IdleReclaim, "idle-reclaim", ublk.DefaultIdleReclaim, "copy mode: give back buffer pages past the registered heads after this long idle (0: never)")
	fs.Func("copy-inline", "user copy: largest request the server thread copies itself; larger ones are copied by io-wq (0: 64 KiB)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		a.queue.CopyInlineBytes = uint32(n)
		return err
	})
	fs.DurationVar(&a.queue.Poll, "poll", time.Millisecond, "longest a server thread polls for completions after a busy round before sleeping (0: never)")
	fs.StringVar(&a.nowait, "nowait-writes", "off", "keep the backing file's mtime current from the server thread (once per clock tick) and send writes with RWF_NOWAIT, instead of io_uring's hand-off to io-wq of the writes that would update it: off (the plugin's default), auto (where the filesystem refuses NOWAIT writes over a stale mtime) or on")
	fs.Func("iowq-workers", "cap on each server thread's io-wq workers (0: 4 with --thread-policy device; shared: the kernel's cap plus the depth of the deepest queue it serves, so that a stalled backing file holds only its own queue's)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		a.thread.IOWQWorkers = uint32(n)
		return err
	})
	return a
}

func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	switch suf := strings.ToUpper(s[len(s)-1:]); suf {
	case "K", "M", "G", "T":
		mult = 1 << (10 * (strings.Index("KMGT", suf) + 1))
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K/M/G/T suffix", s)
	}
	return n * mult, nil
}

// ublkFeatures prints GET_FEATURES decoded.
func ublkFeatures() error {
	ctl, err := ublk.OpenControl()
	if err != nil {
		return err
	}
	defer ctl.Close()
	f, err := ublk.Features(ctl)
	if err != nil {
		return err
	}
	fmt.Printf("kernel %s, ublk features %#x\n", kernel.Release(), f)
	for _, n := range ublk.FlagNames(f) {
		fmt.Println(" ", n)
	}
	return nil
}

// ublkListFlags declares the flags of `csi-fastblk ublk list`.
func ublkListFlags(fs *flag.FlagSet) (dataDir *string) {
	return fs.String("data-dir", "/var/lib/csi-fastblk", "plugin data directory whose devices to recognise")
}

// ublkList lists every ublk device, with its owner when --data-dir is given.
func ublkList(args []string) error {
	fs := flag.NewFlagSet("ublk list", flag.ContinueOnError)
	dataDir := ublkListFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	stateDir := filepath.Join(*dataDir, blockdev.UblkStateDir)
	// Read, not Ensure: listing changes nothing on the node.
	tok, err := owner.Read(*dataDir)
	if err != nil {
		return err
	}
	vols := map[uint32]string{}
	sts, _ := ublk.States(stateDir)
	for _, st := range sts {
		vols[st.DevID] = st.VolumeID
	}
	ctl, err := ublk.OpenControl()
	if err != nil {
		return err
	}
	defer ctl.Close()
	ids, err := ublk.ListIDs()
	if err != nil {
		return err
	}
	fmt.Printf("%-6s %-9s %-8s %-6s %-6s %-30s %s\n", "DEV", "STATE", "PID", "QUEUES", "DEPTH", "OWNER", "FLAGS")
	for _, id := range ids {
		info, err := ctl.GetDevInfo(id)
		if err != nil {
			fmt.Printf("%-6d error: %v\n", id, err)
			continue
		}
		who := "other"
		if tok != 0 && info.UblksrvFlags == tok {
			who = "this data dir"
			if v, ok := vols[id]; ok {
				who = v
			}
		}
		fmt.Printf("%-6d %-9s %-8d %-6d %-6d %-30s %s\n", id, stateName(info.State), info.UblksrvPID,
			info.NrHWQueues, info.QueueDepth, who, ublk.FormatFlags(info.Flags))
	}
	return nil
}

func stateName(s ublk.DevState) string {
	switch s {
	case ublk.StateDead:
		return "dead"
	case ublk.StateLive:
		return "live"
	case ublk.StateQuiesced:
		return "quiesced"
	case ublk.StateFailIO:
		return "fail-io"
	}
	return strconv.Itoa(int(s))
}
