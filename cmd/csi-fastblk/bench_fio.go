package main

// fio as the scale benchmark runs it: one fio process per device, as each
// pod on a node is a process of its own, never a job in its neighbours'
// fio run (a probe run as a job beside its neighbours in one fio process
// measured loop's quiet volume 20-30 times slower than a probe of its own:
// issue 54).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// fioRamp is the seconds each fio process runs before it measures, and
// probeLead how long after its neighbours a probe starts: under qemu's
// emulation fifteen fio processes take seconds to start, and a probe
// started among their start-ups measures them, not its neighbours' I/O.
const (
	fioRamp   = 2
	probeLead = 5
)

// fioResult is what runFio measured over every device.
type fioResult struct {
	iops  float64
	total uint64 // I/Os completed
	// With latProbe: the probe's IOPS and its completion latency
	// percentiles (50, 99, 99.9) and mean in microseconds; iops and
	// total are then the other devices'.
	probeIOPS float64
	lat       [3]float64
	latMean   float64
}

// latPercentiles are the keys of fio's clat_ns percentiles the LAT line
// reports (fio's default list has all three).
var latPercentiles = [3]string{"50.000000", "99.000000", "99.900000"}

// fill writes every device once, so that reads hit real blocks and writes
// overwrite, in both modes alike.
func (c scaleConfig) fill(ctx context.Context, devs []string) error {
	args := []string{"--ioengine=io_uring", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=4", "--output-format=terse"}
	for i, d := range devs {
		args = append(args, fmt.Sprintf("--name=fill%d", i), "--filename="+d)
	}
	if out, err := exec.CommandContext(ctx, c.fio, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("fio fill: %w: %s", err, out)
	}
	return nil
}

// fioSide is one direction of one fio job in fio's JSON output.
type fioSide struct {
	IOPS     float64 `json:"iops"`
	TotalIOs uint64  `json:"total_ios"`
	Clat     struct {
		Mean       float64            `json:"mean"`
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// fioProc is one fio process on one device.
type fioProc struct {
	dev string
	cmd *exec.Cmd
	out bytes.Buffer
}

// startFio starts fio on dev: rw at depth with jobs jobs (group
// reported), measuring for secs seconds after its ramp.
func (c scaleConfig) startFio(ctx context.Context, dev, rw string, depth, jobs, secs int) (*fioProc, error) {
	p := &fioProc{dev: dev}
	p.cmd = exec.CommandContext(ctx, c.fio, "--name=v", "--filename="+dev, "--ioengine=io_uring", "--direct=1",
		"--rw="+rw, "--bs="+c.bs, "--iodepth="+strconv.Itoa(depth), "--numjobs="+strconv.Itoa(jobs),
		"--time_based", "--runtime="+strconv.Itoa(secs), "--ramp_time="+strconv.Itoa(fioRamp),
		"--norandommap", "--randrepeat=0", "--group_reporting", "--output-format=json")
	p.cmd.Stdout = &p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("fio on %s: %w", dev, err)
	}
	return p, nil
}

// wait waits for the process and returns its one (group-reported) job's
// busier direction.
func (p *fioProc) wait() (fioSide, error) {
	if err := p.cmd.Wait(); err != nil {
		return fioSide{}, fmt.Errorf("fio on %s: %w", p.dev, err)
	}
	out := p.out.Bytes()
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:] // fio may print notes before the JSON
	}
	var res struct {
		Jobs []struct{ Read, Write fioSide } `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return fioSide{}, fmt.Errorf("fio on %s: output: %w", p.dev, err)
	}
	if len(res.Jobs) != 1 {
		return fioSide{}, fmt.Errorf("fio on %s: %d job reports, want 1", p.dev, len(res.Jobs))
	}
	side := res.Jobs[0].Read
	if res.Jobs[0].Write.TotalIOs > side.TotalIOs {
		side = res.Jobs[0].Write
	}
	return side, nil
}

// runFio runs the measured workload on every device at once, one fio
// process per device. With latProbe the first device is the probe: at
// iodepth 1, started once its neighbours have ramped up and measured for
// c.runtime while they keep running; its neighbours' figures are over their
// own (slightly longer) run.
func (c scaleConfig) runFio(ctx context.Context, devs []string) (fioResult, error) {
	var r fioResult
	busy := devs
	if c.latProbe {
		busy = devs[1:]
	}
	secs := c.runtime
	if c.latProbe && len(busy) > 0 {
		// Through the probe's lead, ramp and run, with a second to spare.
		secs = c.runtime + probeLead + 1
	}
	var procs []*fioProc
	var errs []error
	for _, d := range busy {
		p, err := c.startFio(ctx, d, c.rw, c.iodepth, c.jobs, secs)
		if err != nil {
			errs = append(errs, err)
			break
		}
		procs = append(procs, p)
	}
	if c.latProbe && len(errs) == 0 {
		if len(busy) > 0 {
			time.Sleep(probeLead * time.Second)
		}
		rw := c.rw
		if c.probeRW != "" {
			rw = c.probeRW
		}
		p, err := c.startFio(ctx, devs[0], rw, 1, 1, c.runtime)
		if err == nil {
			err = c.probeFigures(p, &r)
		}
		errs = append(errs, err)
	}
	for _, p := range procs {
		side, err := p.wait()
		errs = append(errs, err)
		r.iops += side.IOPS
		r.total += side.TotalIOs
	}
	return r, errors.Join(errs...)
}

// probeFigures waits for the probe's fio and puts its figures in r.
func (c scaleConfig) probeFigures(p *fioProc, r *fioResult) error {
	side, err := p.wait()
	if err != nil {
		return err
	}
	r.probeIOPS, r.latMean = side.IOPS, side.Clat.Mean/1e3
	for i, k := range latPercentiles {
		ns, ok := side.Clat.Percentile[k]
		if !ok {
			return fmt.Errorf("fio on %s: no %s percentile", p.dev, k)
		}
		r.lat[i] = ns / 1e3
	}
	return nil
}
