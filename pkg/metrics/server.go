package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the mux with /metrics, /status and /healthz. When the
// backend fell back (startup), /healthz says so after its "ok".
func Handler(status StatusFunc, startup Startup) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(status, startup),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		st, err := status(r.Context())
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case !st.Healthy:
			http.Error(w, st.HealthError, http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
			if r := startup.BackendFallback; r != "" {
				fmt.Fprintf(w, "backend %s: fell back from ublk: %s\n", st.Backend, r)
			}
		}
	})
	return mux
}

// Server serves Handler on one address until Close.
type Server struct {
	srv  *http.Server
	lis  net.Listener
	done chan error
}

// Start listens on addr and serves in a goroutine the Server owns.
func Start(addr string, status StatusFunc, startup Startup) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	s := &Server{
		srv:  &http.Server{Handler: Handler(status, startup), ReadHeaderTimeout: 10 * time.Second},
		lis:  lis,
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(lis) }()
	return s, nil
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
