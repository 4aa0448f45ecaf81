package watch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the hub's Prometheus collectors.
type Metrics struct {
	watchers     prometheus.Gauge
	events       prometheus.Counter
	historyReads prometheus.Counter
	lagCancels   prometheus.Counter
}

// NewMetrics creates the hub's collectors and registers them with reg, if
// non-nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		watchers:     prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "watch", Name: "watchers", Help: "Running watchers."}),
		events:       prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "watch", Name: "events_total", Help: "Committed events handed to the hub."}),
		historyReads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "watch", Name: "history_reads_total", Help: "Batches a watcher read from the durable change log because it was behind the in-memory tail."}),
		lagCancels:   prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "watch", Name: "lag_cancels_total", Help: "Watchers cancelled for falling more than watch.max-lag revisions behind."}),
	}
	if reg != nil {
		reg.MustRegister(m.watchers, m.events, m.historyReads, m.lagCancels)
	}
	return m
}
