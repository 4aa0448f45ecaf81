package mvcc

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics describe the writer and compaction. A nil *metrics records nothing.
//
// The writer's serial part is visible through them: the writer's and the
// committer's busy seconds are the time each of the two goroutines every
// write passes through spent working (evaluating, or publishing and
// answering), not waiting; busy seconds per write are the writer's serial
// time per write, and their inverse the write rate one writer allows on the
// machine (DESIGN.md, "Pipelined group commit").
type metrics struct {
	commitSeconds  prometheus.Histogram
	groupRequests  prometheus.Histogram
	evalSeconds    prometheus.Histogram
	pipelineDepth  prometheus.Histogram
	committerBusy  prometheus.Counter
	requeued       prometheus.Counter
	presumeFailed  prometheus.Counter
	prefetchLookup *prometheus.CounterVec
	prefetch       [4]prometheus.Counter

	// A cluster member opens a backend per leadership: each unregisters
	// its collectors when it closes, so the next one can register.
	reg         prometheus.Registerer
	registered  []prometheus.Collector
	revision    prometheus.GaugeFunc
	compacted   prometheus.GaugeFunc
	compactions prometheus.Counter
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
		evalSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "mvcc", Name: "group_evaluation_seconds",
			Help: "Writer time spent evaluating one group and encoding its batch.", Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20)}),
		pipelineDepth: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "mvcc", Name: "pipeline_depth",
			Help: "Groups committing or waiting to commit when the writer hands over a group, that group included.", Buckets: prometheus.LinearBuckets(1, 1, 8)}),
		committerBusy: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "committer_busy_seconds_total",
			Help: "Time the committer spent publishing and answering groups (the engine's commit itself excluded)."}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "requeued_requests_total",
			Help: "Write requests evaluated again because a group before theirs in the pipeline failed to commit."}),
		presumeFailed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "presumed_absent_failures_total",
			Help: "Commits refused because a create's key, presumed absent without a read, existed; their requests were evaluated again."}),
		prefetchLookup: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "prefetch_lookups_total",
			Help: "The writer's lookups of a key's latest record outside its pipeline, by outcome: used (read ahead by the request and still valid), stale (read ahead, but a later write may have changed it: read again), none (not read ahead: read by the writer), presumed (a create's key presumed absent, not read; checked by the commit)."}, []string{"result"}),
		revision: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "mvcc", Name: "revision", Help: "Current revision."},
			func() float64 { return float64(b.Rev()) }),
		compacted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "mvcc", Name: "compacted_revision", Help: "Compacted revision."},
			func() float64 { return float64(b.CompactRev()) }),
		compactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "physical_compactions_total", Help: "Finished physical compactions."}),
	}
	for i, r := range [...]string{prefetchUsed: "used", prefetchStale: "stale", prefetchNone: "none", prefetchPresumed: "presumed"} {
		m.prefetch[i] = m.prefetchLookup.WithLabelValues(r)
	}
	m.reg = reg
	m.register(m.commitSeconds, m.groupRequests, m.revision, m.compacted, m.compactions,
		m.evalSeconds, m.pipelineDepth, m.committerBusy, m.requeued, m.presumeFailed, m.prefetchLookup,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "engram", Subsystem: "mvcc", Name: "writer_busy_seconds_total",
			Help: "Time the single writer spent evaluating writes and encoding their batches: its serial time."},
			func() float64 { return time.Duration(b.writerBusy.Load()).Seconds() }))
	if c := b.latest; c != nil {
		m.register(
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

// Outcomes of a writer's lookup outside its pipeline.
const (
	prefetchUsed = iota
	prefetchStale
	prefetchNone
	prefetchPresumed
)

func (m *metrics) prefetched(result int) {
	if m != nil {
		m.prefetch[result].Inc()
	}
}

// observeGroup records a group the writer hands over; depth counts the
// groups in the pipeline with it.
func (m *metrics) observeGroup(g *group, depth int) {
	m.groupRequests.Observe(float64(len(g.reqs)))
	m.evalSeconds.Observe(time.Duration(g.evalNanos).Seconds())
	m.pipelineDepth.Observe(float64(depth))
}

// register registers what no other backend of the process still holds (a
// leadership ending while the next begins): the newer backend's series
// then stay unexported until it is next opened.
func (m *metrics) register(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := m.reg.Register(c); err == nil {
			m.registered = append(m.registered, c)
		}
	}
}

func (m *metrics) unregister() {
	if m == nil {
		return
	}
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}
