package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// Handler returns the mux of the network-facing endpoints, /metrics and
// /healthz, and /status too when withStatus is set (--expose-status). When
// the backend fell back (startup), /healthz says so after its "ok".
func Handler(status StatusFunc, startup Startup, withStatus bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(status, startup),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if withStatus {
		mux.Handle("/status", statusHandler(status))
	}
	mux.Handle("/healthz", healthz(status, startup))
	return mux
}

// HealthHandler returns the mux with /healthz alone, for the kubelet's
// liveness probe.
func HealthHandler(status StatusFunc, startup Startup) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", healthz(status, startup))
	return mux
}

// healthz answers "ok" while the plugin is healthy, else 503 with the
// failed part (no host paths).
func healthz(status StatusFunc, startup Startup) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context())
		switch {
		case err != nil:
			// The error may name host paths: they stay in the log.
			klog.ErrorS(err, "/healthz: node status unavailable")
			http.Error(w, "node status unavailable", http.StatusServiceUnavailable)
		case !st.Healthy:
			http.Error(w, st.HealthSummary, http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
			if r := startup.BackendFallback; r != "" {
				fmt.Fprintf(w, "backend %s: fell back from ublk: %s\n", st.Backend, r)
			}
			// A held device does not fail liveness: a restart would
			// hold it again (see ublk.Server.Held). Its reason may name
			// host paths, so only the volume is told here.
			for _, id := range slices.Sorted(maps.Keys(st.Held)) {
				fmt.Fprintf(w, "volume %s: device held, not served (see /status)\n", id)
			}
			for _, dev := range slices.Sorted(maps.Keys(st.FailingIO)) {
				fmt.Fprintf(w, "ublk device %s: kept but not re-adopted, fails its i/o since %s (see /status)\n", dev, st.FailingIO[dev])
			}
		}
	})
}

// StatusHandler returns the mux with /status alone: the node's volumes,
// their names, paths and devices, for a local-only listener.
func StatusHandler(status StatusFunc) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/status", statusHandler(status))
	return mux
}

func statusHandler(status StatusFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
}

// Timeouts of the HTTP servers: a client that sends its request slowly, or
// reads the answer slowly, cannot hold a connection (and its goroutine)
// for long. Writing covers computing the answer: a scrape of a node with
// many volumes reads every device's counters.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 60 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 16 << 10
)

// Server serves one handler on one listener until Close.
type Server struct {
	srv  *http.Server
	lis  net.Listener
	done chan error
}

// Serve serves h on lis in a goroutine the Server owns; Close closes lis.
func Serve(lis net.Listener, h http.Handler) *Server {
	s := &Server{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
			WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes},
		lis:  lis,
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(lis) }()
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Close shuts the server down and waits for its goroutine.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
