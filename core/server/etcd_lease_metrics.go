package server

import (
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// etcdLeaseMetrics are etcd's lessor metrics (etcd_debugging_lease_*),
// counted where Engram's lessor does the same: a grant and a revocation
// that succeeded, an expiry revoked, a keepalive answered with a TTL. etcd
// counts grants and revocations on every member as it applies them;
// Engram counts them on the node the request reached (and expiries on the
// leader), so in a cluster they sum over the nodes instead.
type etcdLeaseMetrics struct {
	granted, revoked, renewed prometheus.Counter
	ttls                      prometheus.Histogram
}

func newEtcdLeaseMetrics(reg prometheus.Registerer) *etcdLeaseMetrics {
	m := &etcdLeaseMetrics{
		granted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "granted_total",
			Help: "The total number of granted leases."}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "revoked_total",
			Help: "The total number of revoked leases."}),
		renewed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "renewed_total",
			Help: "The number of renewed leases seen by the leader."}),
		ttls: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "ttl_total",
			Help: "Bucketed histogram of lease TTLs.", Buckets: prometheus.ExponentialBuckets(1, 2, 24)}),
	}
	if reg != nil {
		reg.MustRegister(m.granted, m.revoked, m.renewed, m.ttls)
	}
	return m
}

// answered counts a successful grant (with the TTL granted) or
// revocation from its answer (Server.unaryChecked); the renewals are
// counted on the keepalive stream (countedStream).
func (m *etcdLeaseMetrics) answered(resp any) {
	switch r := resp.(type) {
	case *pb.LeaseGrantResponse:
		m.granted.Inc()
		m.ttls.Observe(float64(r.TTL))
	case *pb.LeaseRevokeResponse:
		m.revoked.Inc()
	}
}
