package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/metrics"
)

// startMetrics serves /metrics and /healthz on --metrics-address (unless
// empty), /healthz alone on --health-address (unless empty), and /status on --status-address, a local-only listener; /status
// also goes on the metrics address with --expose-status.
func startMetrics(cfg *serveConfig, status metrics.StatusFunc, startup metrics.Startup) (stop func(), err error) {
	var servers []*metrics.Server
	stop = func() {
		for _, srv := range servers {
			if err := srv.Close(); err != nil {
				klog.ErrorS(err, "stop HTTP server", "address", srv.Addr())
			}
		}
	}
	if cfg.metricsAddress != "" {
		lis, err := net.Listen("tcp", cfg.metricsAddress)
		if err != nil {
			return nil, fmt.Errorf("metrics listen %s: %w", cfg.metricsAddress, err)
		}
		servers = append(servers, metrics.Serve(lis, metrics.Handler(status, startup, cfg.exposeStatus)))
		klog.InfoS("serving metrics", "address", lis.Addr(), "status", cfg.exposeStatus)
	}
	if cfg.healthAddress != "" {
		lis, err := net.Listen("tcp", cfg.healthAddress)
		if err != nil {
			stop()
			return nil, fmt.Errorf("health listen %s: %w", cfg.healthAddress, err)
		}
		servers = append(servers, metrics.Serve(lis, metrics.HealthHandler(status, startup)))
		klog.InfoS("serving health", "address", lis.Addr())
	}
	addr := statusAddress(cfg)
	if addr == "" {
		return stop, nil
	}
	lis, err := listenStatus(addr)
	if err != nil {
		stop()
		return nil, err
	}
	servers = append(servers, metrics.Serve(lis, metrics.StatusHandler(status)))
	klog.InfoS("serving status", "address", addr)
	return stop, nil
}

// statusAddress is where /status is served: --status-address, by default
// status.sock beside a unix CSI endpoint's socket; "" for none.
func statusAddress(cfg *serveConfig) string {
	switch addr := cfg.statusAddress; {
	case addr == "none":
		return ""
	case addr != "":
		return addr
	}
	u, err := url.Parse(cfg.endpoint)
	if err != nil || u.Scheme != "unix" {
		return ""
	}
	return "unix://" + filepath.Join(filepath.Dir(filepath.Join(u.Host, u.Path)), statusSocket)
}

// statusSocket is the name of the status socket beside the CSI socket.
const statusSocket = "status.sock"

// listenStatus listens on unix:///path (mode 0660, as the CSI socket) or
// host:port.
func listenStatus(addr string) (net.Listener, error) {
	if strings.HasPrefix(addr, "unix://") {
		lis, err := driver.Listen(addr)
		if err != nil {
			return nil, fmt.Errorf("status listen %s: %w", addr, err)
		}
		return lis, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("status listen %s: %w", addr, err)
	}
	return lis, nil
}

// defaultStatusAddresses are where `csi-fastblk status` looks for the
// plugin without --address: beside the default CSI endpoint, and beside the
// chart's (/csi/csi.sock in the plugin container).
var defaultStatusAddresses = []string{"unix:///run/csi-fastblk/" + statusSocket, "unix:///csi/" + statusSocket}

// runStatus shows a node's volumes, devices, tuning, state and I/O figures,
// read from the running plugin's /status endpoint.
func runStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr, asJSON := statusFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" {
		*addr = findStatusSocket(defaultStatusAddresses)
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

// statusFlags declares the flags of `csi-fastblk status`.
func statusFlags(fs *flag.FlagSet) (addr *string, asJSON *bool) {
	addr = fs.String("address", "", "the plugin's status address: unix:///path/status.sock or [http://]host:port "+
		"(default: the first of "+strings.Join(defaultStatusAddresses, ", ")+" that exists)")
	asJSON = fs.Bool("json", false, "print the raw status as JSON")
	return addr, asJSON
}

// findStatusSocket returns the first of addrs whose socket exists, or the
// first of them.
func findStatusSocket(addrs []string) string {
	for _, a := range addrs {
		if _, err := os.Stat(strings.TrimPrefix(a, "unix://")); err == nil {
			return a
		}
	}
	return addrs[0]
}

// fetchStatus gets /status from addr: unix:///path or [http://]host:port.
func fetchStatus(ctx context.Context, addr string) (driver.NodeStatus, []byte, error) {
	var st driver.NodeStatus
	client, base := http.DefaultClient, addr
	if sock, ok := strings.CutPrefix(addr, "unix://"); ok {
		client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
		base = "http://localhost"
	} else if !strings.Contains(addr, "://") {
		base = "http://" + addr
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/status", nil)
	if err != nil {
		return st, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, nil, fmt.Errorf("reach the plugin at %s (is it running? see --status-address): %w", addr, err)
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
	var down []string
	for _, c := range st.Classes {
		if c.Unavailable {
			down = append(down, c.Name)
		}
	}
	switch {
	case !st.Healthy:
		health = "UNHEALTHY: " + st.HealthError
	case len(down) == 1:
		health = "DEGRADED: device class " + down[0] + " unavailable"
	case len(down) > 1:
		health = "DEGRADED: device classes " + strings.Join(down, ", ") + " unavailable"
	}
	fmt.Fprintf(w, "node %s  driver %s %s  kernel %s  backend %s  %s\n",
		st.NodeID, st.Driver, st.Version, st.Kernel, st.Backend, health)
	fmt.Fprintf(w, "volumes %d  snapshots %d", len(st.Volumes), st.Snapshots)
	if st.PidsHeadroom != nil {
		fmt.Fprintf(w, "  pids headroom %d", *st.PidsHeadroom)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	printClasses(w, st.Classes)
	if len(st.Quarantined) > 0 {
		fmt.Fprintf(w, "QUARANTINED: %d unreadable record(s) set aside; their volumes are out of service until restored or removed:\n", len(st.Quarantined))
		for _, p := range st.Quarantined {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	if len(st.Held) > 0 {
		fmt.Fprintf(w, "HELD: %d volume(s) whose device is kept, its I/O held, but not served; check each device against its volume:\n", len(st.Held))
		for _, id := range slices.Sorted(maps.Keys(st.Held)) {
			fmt.Fprintf(w, "  %s: %s\n", id, st.Held[id])
		}
	}
	if len(st.Kept) > 0 {
		fmt.Fprintf(w, "KEPT: %d volume(s) that no claim uses, kept on this node:\n", len(st.Kept))
		for _, id := range slices.Sorted(maps.Keys(st.Kept)) {
			fmt.Fprintf(w, "  %s: %s\n", id, st.Kept[id])
		}
	}
	if len(st.FailingIO) > 0 {
		fmt.Fprintf(w, "FAILING I/O: %d ublk device(s) kept but not re-adopted (no readable record names them), their I/O failed with EIO; "+
			"restore the volume's device link or state file, then restart the plugin:\n", len(st.FailingIO))
		for _, dev := range slices.Sorted(maps.Keys(st.FailingIO)) {
			fmt.Fprintf(w, "  %s since %s\n", dev, st.FailingIO[dev])
		}
	}
	for _, p := range st.Pulls {
		fmt.Fprintf(w, "COPYING into %s (%s) from %s on node %s: %s of at most %s of data received (source %s) in %.0fs\n",
			p.VolumeID, p.Name, p.Source, p.SourceNode, human(p.ReceivedBytes), human(p.ExpectedBytes), human(p.SizeBytes), p.Seconds)
	}
	if cp := st.CopyPacing; cp.Copies > 0 {
		allowed := "no bound but their rates"
		if cp.Bounded {
			allowed = human(int64(cp.AllowedBytesPerSecond)) + "/s"
		}
		fmt.Fprintf(w, "COPIES PACED: %d, allowed %s while a volume is in use (last cost %.0f%% of %s's IOPS, %d pauses)\n",
			cp.Copies, allowed, cp.Cost*100, cp.Device, cp.Pauses)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tNAME\tCLASS\tSIZE\tACCESS\tDEVICE\tBACKEND\tQUEUES\tDEPTH\tMAX-IO\tLIMIT\tSTATE\tREADS\tWRITES\tREAD\tWRITTEN\tIN-FLIGHT")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			v.ID, v.Name, dash(v.Class), human(v.SizeBytes), dash(v.Access), dash(v.Device), dash(v.Backend),
			v.Tuning.Queues, v.Tuning.QueueDepth, maxIO, limitText(v.Limits), state, reads, writes, rb, wb, inflight)
	}
	tw.Flush()
}

// printClasses is the table of device classes, then, for each class the
// node cannot serve, why and its volumes out of service.
func printClasses(w io.Writer, classes []driver.ClassStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tPATH\tAVAILABLE\tTOTAL\tFS-FREE\tVOLUMES\tSNAPSHOTS\tSTATE")
	for _, c := range classes {
		state := "served"
		switch {
		case c.Unavailable:
			state = "UNAVAILABLE"
		case c.Error != "":
			state = "error: " + c.Error
		}
		if c.Unavailable {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t%d\t-\t%s\n", c.Name, c.Path, c.Volumes, state)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", c.Name, c.Path, human(c.CapacityAvailable), human(c.CapacityTotal),
			human(c.FilesystemFree), c.Volumes, c.Snapshots, state)
	}
	tw.Flush()
	for _, c := range classes {
		if !c.Unavailable {
			continue
		}
		fmt.Fprintf(w, "UNAVAILABLE device class %s: %s\n", c.Name, c.Error)
		if len(c.Stranded) > 0 {
			fmt.Fprintf(w, "  %d volume(s) out of service, their files kept in %s:\n", len(c.Stranded), c.Path)
			for _, id := range c.Stranded {
				fmt.Fprintf(w, "    %s\n", id)
			}
		}
	}
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
