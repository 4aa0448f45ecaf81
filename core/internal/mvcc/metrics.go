package mvcc

import "github.com/prometheus/client_golang/prometheus"

// metrics describe the writer and compaction. A nil *metrics records nothing.
type metrics struct {
	commitSeconds prometheus.Histogram
	groupRequests prometheus.Histogram
	revision      prometheus.GaugeFunc
	compacted     prometheus.GaugeFunc
	compactions   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, b *Backend) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "mvcc", Name: "commit_duration_seconds",
			Help: "Time to commit one group of writes to the storage engine (one fsync on durable engines).", Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)}),
		groupRequests: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "mvcc", Name: "group_requests",
			Help: "Write requests committed together in one group.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		revision: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "mvcc", Name: "revision", Help: "Current revision."},
			func() float64 { return float64(b.Rev()) }),
		compacted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "mvcc", Name: "compacted_revision", Help: "Compacted revision."},
			func() float64 { return float64(b.CompactRev()) }),
		compactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "physical_compactions_total", Help: "Finished physical compactions."}),
	}
	reg.MustRegister(m.commitSeconds, m.groupRequests, m.revision, m.compacted, m.compactions)
	if c := b.latest; c != nil {
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "latest_cache_hits_total",
				Help: "Latest-version lookups (point reads, write checks) answered from memory."},
				func() float64 { h, _, _ := c.stats(); return float64(h) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "latest_cache_misses_total",
				Help: "Latest-version lookups that read the storage engine."},
				func() float64 { _, m, _ := c.stats(); return float64(m) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "mvcc", Name: "latest_cache_bytes",
				Help: "Approximate memory held by the latest-version cache."},
				func() float64 { _, _, n := c.stats(); return float64(n) }),
		)
	}
	return m
}
