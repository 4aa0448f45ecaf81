package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec countingCodec wraps
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/kv"
)

// etcdMetrics export, under etcd 3.6's own names, types, help texts, labels
// and buckets, what Engram does the way etcd does, so that the etcd mixin's
// alerts and the etcd dashboards operators already run work unchanged. A
// metric of etcd's with no meaning here (raft peers, the WAL, bbolt's
// internals) is absent rather than faked; README.md, "Metrics", has the
// mapping.
type etcdMetrics struct {
	// grpc are etcd's grpc_server_* metrics (grpc_metrics.go).
	grpc *grpcServerMetrics

	leaderChanges    prometheus.Counter
	proposalsFailed  prometheus.Counter
	proposalsPending prometheus.Gauge
	commitSeconds    prometheus.Histogram
	watchStreams     prometheus.Gauge
	sentBytes        prometheus.Counter
	receivedBytes    prometheus.Counter
	mvcc             *mvccMetrics

	// lastLeader is the last known leader counted in leaderChanges; only
	// publishRole touches it, under roleMu.
	lastLeader string
}

// newEtcdMetrics creates the collectors and registers them with reg, if
// non-nil. The gauges read s when scraped.
func newEtcdMetrics(s *Server, reg prometheus.Registerer) *etcdMetrics {
	m := &etcdMetrics{
		grpc: newGRPCServerMetrics(),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "server", Name: "leader_changes_seen_total",
			Help: "The number of leader changes seen."}),
		proposalsFailed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "server", Name: "proposals_failed_total",
			Help: "The total number of failed proposals seen."}),
		proposalsPending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "proposals_pending",
			Help: "The current number of pending proposals to commit."}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "etcd", Subsystem: "disk", Name: "backend_commit_duration_seconds",
			Help: "The latency distributions of commit called by backend.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		watchStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "etcd_debugging", Subsystem: "mvcc", Name: "watch_stream_total",
			Help: "Total number of watch streams."}),
		sentBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "network", Name: "client_grpc_sent_bytes_total",
			Help: "The total number of bytes sent to grpc clients."}),
		receivedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "network", Name: "client_grpc_received_bytes_total",
			Help: "The total number of bytes received from grpc clients."}),
		mvcc: newMVCCMetrics(reg, s.leaseKeyCount),
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
	serverVersion := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "version",
		Help: "Which version is running. 1 for 'server_version' label with current version."}, []string{"server_version"})
	serverVersion.WithLabelValues(version.Version).Set(1)
	reg.MustRegister(m.grpc.collectors()...)
	reg.MustRegister(m.leaderChanges, m.proposalsFailed, m.proposalsPending, m.commitSeconds, m.watchStreams,
		m.sentBytes, m.receivedBytes, serverVersion,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "has_leader",
			Help: "Whether or not a leader exists. 1 is existence, 0 is not."},
			func() float64 { _, ok := s.Leader(); return bool01(ok) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "is_leader",
			Help: "Whether or not this member is a leader. 1 if is, 0 otherwise."},
			func() float64 { return bool01(s.IsLeader()) }),
		// etcd sets these from raft's commit and applied indexes; Engram
		// commits and applies in one step and reports its revision as
		// the raft index (Status), so both are that revision.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "proposals_committed_total",
			Help: "The total number of consensus proposals committed."},
			func() float64 { return float64(s.currentRev()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "proposals_applied_total",
			Help: "The total number of consensus proposals applied."},
			func() float64 { return float64(s.currentRev()) }),
	)
	if sz, ok := s.opts.Store.(kv.Sizer); ok {
		reg.MustRegister(&dbSizeCollector{size: sz})
		if s.opts.QuotaBackendBytes > 0 {
			reg.MustRegister(quotaGauge(s.opts.QuotaBackendBytes))
		}
	}
	return m
}

// leaderSeen counts a change of the known leader as etcd counts raft's:
// each time a leader other than the last one is known, the first one
// included. Call it under roleMu.
func (m *etcdMetrics) leaderSeen(leader string) {
	if leader != "" && leader != m.lastLeader {
		m.leaderChanges.Inc()
		m.lastLeader = leader
	}
}

// proposalEnded counts a write request's raft proposal as etcd would when
// it ended with err: failed when it ended without being committed (etcd:
// the proposal was dropped, timed out or the request went away). Errors
// the request itself causes are answers, not failures. While it runs it
// is pending (Server.unaryChecked).
func (m *etcdMetrics) proposalEnded(err error) {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal:
		m.proposalsFailed.Inc()
	}
}

// isProposal reports whether etcd would put req through raft: writes,
// compaction, lease grants and revocations, and every Txn but one whose
// branches hold nothing but Ranges. A Txn that nests another goes through
// raft even when the nested one only reads (etcd's IsTxnReadonly looks at
// the top level alone), so it is counted too.
func isProposal(req any) bool {
	switch r := req.(type) {
	case *pb.PutRequest, *pb.DeleteRangeRequest, *pb.CompactionRequest, *pb.LeaseGrantRequest, *pb.LeaseRevokeRequest:
		return true
	case *pb.TxnRequest:
		return !onlyRanges(r)
	}
	return false
}

// countingCodec is gRPC's proto codec counting the payload bytes of
// client messages for etcd_network_client_grpc_{sent,received}_bytes_total
// as etcd's own codec does: a message sent when it is encoded, one
// received once it is decoded.
type countingCodec struct {
	encoding.CodecV2
	m *etcdMetrics
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

func (c countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := c.CodecV2.Marshal(v)
	if err == nil {
		c.m.sentBytes.Add(float64(out.Len()))
	}
	return out, err
}

func (c countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		c.m.receivedBytes.Add(float64(data.Len()))
	}
	return err
}

// dbSizeCollector reports the engine's size where the adaptor knows it,
// and nothing at a scrape where it cannot tell (rather than a false 0).
// Engram has no free pages to tell apart, so "in use" is the same size, as
// Status reports DbSizeInUse.
type dbSizeCollector struct{ size kv.Sizer }

var (
	dbTotalDesc = prometheus.NewDesc("etcd_mvcc_db_total_size_in_bytes",
		"Total size of the underlying database physically allocated in bytes.", nil, nil)
	dbInUseDesc = prometheus.NewDesc("etcd_mvcc_db_total_size_in_use_in_bytes",
		"Total size of the underlying database logically in use in bytes.", nil, nil)
)

func (c *dbSizeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dbTotalDesc; ch <- dbInUseDesc }
func (c *dbSizeCollector) Collect(ch chan<- prometheus.Metric) {
	n, err := c.size.Size()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(dbTotalDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(dbInUseDesc, prometheus.GaugeValue, float64(n))
}

// timedStore times the leader's commits into the storage engine for
// etcd_disk_backend_commit_duration_seconds: each is what etcd's backend
// commit is, the point a group of writes becomes durable. Only the MVCC
// backend uses it; it passes the rest through.
type timedStore struct {
	kv.Store
	seconds prometheus.Observer
}

func (t timedStore) Commit(ctx context.Context, ops []kv.Op) error {
	start := time.Now()
	err := t.Store.Commit(ctx, ops)
	t.seconds.Observe(time.Since(start).Seconds())
	return err
}

// currentRev is the revision this node serves: the leader's, or a
// follower's view of the shared store.
func (s *Server) currentRev() int64 {
	// The follower's reader is set before the server is ready; reading
	// ready first orders that write before this read.
	if !s.ready.Load() {
		return 0
	}
	s.mu.Lock()
	ls := s.leader
	s.mu.Unlock()
	switch {
	case ls != nil:
		return ls.backend.Rev()
	case s.reader != nil:
		return s.reader.Rev()
	}
	return 0
}
