package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/metrics"
)

// startMetrics serves /metrics, /status and /healthz unless addr is empty.
func startMetrics(ctx context.Context, addr string, d *driver.Driver, startup metrics.Startup) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	srv, err := metrics.Start(addr, d.Status, startup)
	if err != nil {
		return nil, err
	}
	klog.InfoS("serving metrics", "address", srv.Addr())
	return func() {
		if err := srv.Close(); err != nil {
			klog.ErrorS(err, "stop metrics server")
		}
	}, nil
}

// runStatus shows a node's volumes, devices, tuning, state and I/O figures,
// read from the running plugin's /status endpoint.
func runStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := fs.String("address", "http://127.0.0.1:9811", "the plugin's metrics address")
	asJSON := fs.Bool("json", false, "print the raw status as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, raw, err := fetchStatus(ctx, *addr)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := os.Stdout.Write(raw)
		return err
	}
	printStatus(os.Stdout, st)
	return nil
}

func fetchStatus(ctx context.Context, addr string) (driver.NodeStatus, []byte, error) {
	var st driver.NodeStatus
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+"/status", nil)
	if err != nil {
		return st, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, nil, fmt.Errorf("reach the plugin at %s (is it running with --metrics-address?): %w", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, nil, fmt.Errorf("read status: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, nil, fmt.Errorf("status: %s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, nil, fmt.Errorf("decode status: %w", err)
	}
	return st, raw, nil
}

func printStatus(w io.Writer, st driver.NodeStatus) {
	health := "healthy"
	if !st.Healthy {
		health = "UNHEALTHY: " + st.HealthError
	}
	fmt.Fprintf(w, "node %s  driver %s %s  kernel %s  backend %s  %s\n",
		st.NodeID, st.Driver, st.Version, st.Kernel, st.Backend, health)
	fmt.Fprintf(w, "capacity %s available of %s  volumes %d  snapshots %d",
		human(st.CapacityAvailable), human(st.CapacityTotal), len(st.Volumes), st.Snapshots)
	if st.PidsHeadroom != nil {
		fmt.Fprintf(w, "  pids headroom %d", *st.PidsHeadroom)
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tNAME\tSIZE\tACCESS\tDEVICE\tBACKEND\tQUEUES\tDEPTH\tMAX-IO\tLIMIT\tSTATE\tREADS\tWRITES\tREAD\tWRITTEN\tIN-FLIGHT")
	for _, v := range st.Volumes {
		state, reads, writes, rb, wb, inflight := "detached", "-", "-", "-", "-", "-"
		if v.Device != "" {
			state = "live"
			if v.IO != nil && v.IO.State != "" {
				state = v.IO.State
			}
		}
		if d := v.Disk; d != nil {
			reads, writes = fmt.Sprint(d.ReadIOs), fmt.Sprint(d.WriteIOs)
			rb, wb = human(int64(d.ReadSectors*512)), human(int64(d.WriteSectors*512))
			inflight = fmt.Sprint(d.InFlight)
		}
		maxIO := "-"
		if v.Tuning.MaxIOBytes > 0 {
			maxIO = human(int64(v.Tuning.MaxIOBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			v.ID, v.Name, human(v.SizeBytes), dash(v.Access), dash(v.Device), dash(v.Backend),
			v.Tuning.Queues, v.Tuning.QueueDepth, maxIO, limitText(v.Limits), state, reads, writes, rb, wb, inflight)
	}
	tw.Flush()
}

// limitText shows rate limits as "5000iops,200.0MiB/s" (one field, as
// every cell of the table is), "-" for none.
func limitText(l qos.Limits) string {
	var parts []string
	if l.IOPS > 0 {
		parts = append(parts, fmt.Sprintf("%diops", l.IOPS))
	}
	if l.BytesPerSecond > 0 {
		parts = append(parts, human(l.BytesPerSecond)+"/s")
	}
	return dash(strings.Join(parts, ","))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
