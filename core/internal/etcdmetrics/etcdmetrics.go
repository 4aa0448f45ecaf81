// Package etcdmetrics exports, under etcd 3.6's own names, types, help
// texts, labels and buckets, what Engram does the way etcd does, so that the
// etcd mixin's alerts and the etcd dashboards operators already run work
// unchanged. A metric of etcd's with no meaning here (raft peers, the WAL,
// bbolt's internals) is absent rather than faked; README.md, "Metrics", has
// the mapping.
//
// It owns etcd's model of a request: whether etcd would put it through raft
// (a proposal), which MVCC transactions etcd would run to answer it and what
// each did, what its lessor counts (request.go, mvcc.go, lease.go). That
// meaning is decided here and nowhere else in the server: the server's
// interceptor hands each unary request to Begin and its answer to End, and
// knows nothing of what they count. It also owns etcd's storage-side series
// (the backend commit time, the database size and quota, storage.go) and
// the client byte counts (the gRPC codec, codec.go). It sits beside etcdapi,
// the API layer it measures, and reads nothing of the server but what
// Sources gives it.
//
// It must not change a request or its answer, must not fail one, and must
// not cost an answered request an allocation: it only counts. It does not
// export etcd's grpc_server_* series: those are counted per gRPC method,
// together with Engram's own engram_grpc_* series, in one table the server
// resolves once per method (core/server, grpc_metrics.go).
//
// The plan, so that etcd's emulation lives beside the API layer it measures
// and a request's meaning is decided in one place: (1) the emulation moves
// out of core/server, with the classification of a request behind Begin and
// End (done); (2) the grpc_server_* vectors move here too, exported for the
// server's per-method table; (3) where etcdapi already decides what a
// request is (its write path, its checks of a Put's ignore_value,
// ignore_lease and prev_kv), it hands that decision to Begin instead of
// this package reading the fields again, provided that costs a request no
// allocation.
package etcdmetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/version"

	"github.com/engramkv/engram/core/kv"
)

// Sources are what the metrics read from the server when scraped or when a
// request arrives.
type Sources struct {
	// HasLeader reports whether a leader is known (etcd_server_has_leader).
	HasLeader func() bool
	// IsLeader reports whether this node leads (etcd_server_is_leader).
	IsLeader func() bool
	// Revision is the revision this node serves, which Engram reports as
	// both the raft commit and applied index.
	Revision func() int64
	// LeaseKeys is how many keys are attached to a lease: etcd deletes
	// each, one by one, in the MVCC transaction that revokes the lease.
	LeaseKeys func(id int64) int
	// Store is the storage engine; its size is exported when it is a
	// kv.Sizer.
	Store kv.Store
	// QuotaBackendBytes is the configured quota; 0 exports none.
	QuotaBackendBytes int64
}

// Metrics are etcd's metrics of one server.
type Metrics struct {
	leaderChanges    prometheus.Counter
	proposalsFailed  prometheus.Counter
	proposalsPending prometheus.Gauge
	commitSeconds    prometheus.Histogram
	watchStreams     prometheus.Gauge
	sentBytes        prometheus.Counter
	receivedBytes    prometheus.Counter
	mvcc             *mvccMetrics
	lease            *leaseMetrics

	// lastLeader is the last known leader counted in leaderChanges; only
	// LeaderSeen touches it, and its caller serialises the calls.
	lastLeader string
}

// New creates the collectors and registers them with reg, if non-nil. The
// gauges read src when scraped.
func New(reg prometheus.Registerer, src Sources) *Metrics {
	m := &Metrics{
		leaderChanges:    counter("etcd_server_leader_changes_seen_total", "The number of leader changes seen."),
		proposalsFailed:  counter("etcd_server_proposals_failed_total", "The total number of failed proposals seen."),
		proposalsPending: gauge("etcd_server_proposals_pending", "The current number of pending proposals to commit."),
		commitSeconds: histogram("etcd_disk_backend_commit_duration_seconds", "The latency distributions of commit called by backend.",
			prometheus.ExponentialBuckets(0.001, 2, 14)),
		watchStreams:  gauge("etcd_debugging_mvcc_watch_stream_total", "Total number of watch streams."),
		sentBytes:     counter("etcd_network_client_grpc_sent_bytes_total", "The total number of bytes sent to grpc clients."),
		receivedBytes: counter("etcd_network_client_grpc_received_bytes_total", "The total number of bytes received from grpc clients."),
		mvcc:          newMVCCMetrics(reg, src.LeaseKeys),
		lease:         newLeaseMetrics(reg),
	}
	if reg == nil {
		return m
	}
	bool01 := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	serverVersion := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_server_version",
		Help: "Which version is running. 1 for 'server_version' label with current version."}, []string{"server_version"})
	serverVersion.WithLabelValues(version.Version).Set(1)
	// etcd sets proposals_committed_total and proposals_applied_total from
	// raft's commit and applied indexes; Engram commits and applies in one
	// step and reports its revision as the raft index (Status), so both
	// are that revision.
	revision := func() float64 { return float64(src.Revision()) }
	reg.MustRegister(m.leaderChanges, m.proposalsFailed, m.proposalsPending, m.commitSeconds, m.watchStreams,
		m.sentBytes, m.receivedBytes, serverVersion,
		gaugeFunc("etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.",
			func() float64 { return bool01(src.HasLeader()) }),
		gaugeFunc("etcd_server_is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise.",
			func() float64 { return bool01(src.IsLeader()) }),
		gaugeFunc("etcd_server_proposals_committed_total", "The total number of consensus proposals committed.", revision),
		gaugeFunc("etcd_server_proposals_applied_total", "The total number of consensus proposals applied.", revision),
	)
	if sz, ok := src.Store.(kv.Sizer); ok {
		reg.MustRegister(&dbSizeCollector{size: sz})
		if src.QuotaBackendBytes > 0 {
			reg.MustRegister(quotaGauge(src.QuotaBackendBytes))
		}
	}
	return m
}

// counter, gauge, gaugeFunc and histogram make a series of etcd's under
// its full name, as etcd's documentation, alerts and dashboards spell it.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func gaugeFunc(name, help string, value func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, value)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// LeaderSeen counts a change of the known leader as etcd counts raft's:
// each time a leader other than the last one is known, the first one
// included. Calls must be serialised.
func (m *Metrics) LeaderSeen(leader string) {
	if leader != "" && leader != m.lastLeader {
		m.leaderChanges.Inc()
		m.lastLeader = leader
	}
}

// WatchStreamOpened and WatchStreamClosed count the open watch streams, as
// etcd counts its own.
func (m *Metrics) WatchStreamOpened() { m.watchStreams.Inc() }

// WatchStreamClosed: see WatchStreamOpened.
func (m *Metrics) WatchStreamClosed() { m.watchStreams.Dec() }
