package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readiness is what /readyz reports. It starts "recovering", becomes the
// server's own Ready() once the server exists, and turns "shutting down" on
// the first signal so load balancers stop sending new work before the
// listeners close.
type readiness struct {
	check    atomic.Pointer[func() error]
	draining atomic.Bool
}

func (r *readiness) setCheck(f func() error) { r.check.Store(&f) }

func (r *readiness) err() error {
	if r.draining.Load() {
		return fmt.Errorf("shutting down")
	}
	f := r.check.Load()
	if f == nil {
		return fmt.Errorf("recovering state from storage")
	}
	return (*f)()
}

// opsHandler serves /metrics from reg, /healthz, /readyz and /debug/pprof/.
// The pprof handlers are mounted explicitly on this mux; importing
// net/http/pprof also registers them on http.DefaultServeMux, which this
// binary never serves.
func opsHandler(reg *prometheus.Registry, ready *readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg,
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Liveness only: the process answers. Readiness is /readyz.
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready.err(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
