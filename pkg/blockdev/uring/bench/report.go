package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

var quantiles = []struct {
	name string
	q    float64
}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p99.9", 0.999}}

func usec(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Print writes a fio-like human report.
func (r *Result) Print(w io.Writer) {
	c := r.Config
	direct := map[bool]int{false: 0, true: 1}[c.Direct]
	fmt.Fprintf(w, "engine: file=%s rw=%s bs=%d iodepth=%d jobs=%d runtime=%v direct=%d wait_min=%d submit_batch=%d poll=%v fixed=%v\n",
		c.File, c.RW, c.BS, c.IODepth, c.Jobs, c.Runtime, direct, c.WaitMin, c.SubmitBatch, c.Poll, !c.NoFixed)
	dir := "read"
	if c.RW == "write" || c.RW == "randwrite" {
		dir = "write"
	}
	fmt.Fprintf(w, "  %s: IOPS=%.0f, BW=%.1fMiB/s (%.1fMB/s), ios=%d in %.2fs\n",
		dir, r.IOPS(), r.BW()/(1<<20), r.BW()/1e6, r.IOs, r.Elapsed.Seconds())
	fmt.Fprintf(w, "  clat percentiles (usec):")
	for _, q := range quantiles {
		fmt.Fprintf(w, " %s=%.1f", q.name, usec(r.Percentile(q.q)))
	}
	fmt.Fprintln(w)
	ios := float64(max(r.IOs, 1))
	fmt.Fprintf(w, "  cpu: ctx switches=%d (voluntary %d, involuntary %d), per io=%.4f\n",
		r.VolCS+r.InvolCS, r.VolCS, r.InvolCS, float64(r.VolCS+r.InvolCS)/ios)
	fmt.Fprintf(w, "  syscalls: io_uring_enter=%d, per io=%.4f\n", r.Enters, float64(r.Enters)/ios)
}

// JSON is the machine-readable form of a Result.
type JSON struct {
	RW          string             `json:"rw"`
	BS          int                `json:"bs"`
	IODepth     int                `json:"iodepth"`
	Jobs        int                `json:"jobs"`
	IOPS        float64            `json:"iops"`
	BWBytes     float64            `json:"bw_bytes"`
	ClatUsec    map[string]float64 `json:"clat_usec"`
	CtxSw       int64              `json:"ctx_switches"`
	CtxSwPerIO  float64            `json:"ctx_switches_per_io"`
	Enters      uint64             `json:"io_uring_enter"`
	EntersPerIO float64            `json:"syscalls_per_io"`
}

// WriteJSON writes the result as one JSON object.
func (r *Result) WriteJSON(w io.Writer) error {
	ios := float64(max(r.IOs, 1))
	j := JSON{RW: r.Config.RW, BS: r.Config.BS, IODepth: r.Config.IODepth, Jobs: r.Config.Jobs,
		IOPS: r.IOPS(), BWBytes: r.BW(), ClatUsec: map[string]float64{},
		CtxSw: r.VolCS + r.InvolCS, CtxSwPerIO: float64(r.VolCS+r.InvolCS) / ios,
		Enters: r.Enters, EntersPerIO: float64(r.Enters) / ios}
	for _, q := range quantiles {
		j.ClatUsec[q.name] = usec(r.Percentile(q.q))
	}
	return json.NewEncoder(w).Encode(j)
}
