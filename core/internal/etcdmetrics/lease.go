package etcdmetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// leaseMetrics are etcd's lessor metrics (etcd_debugging_lease_*),
// counted where Engram's lessor does the same: a grant and a revocation
// that succeeded, an expiry revoked, a keepalive answered with a TTL. etcd
// counts grants and revocations on every member as it applies them;
// Engram counts them on the node the request reached (and expiries on the
// leader), so in a cluster they sum over the nodes instead.
type leaseMetrics struct {
	granted, revoked, renewed prometheus.Counter
	ttls                      prometheus.Histogram
	// expired is etcd_debugging_server_lease_expired_total: etcd's leader
	// counts an expired lease once its revocation succeeded, as here.
	expired prometheus.Counter
}

func newLeaseMetrics(reg prometheus.Registerer) *leaseMetrics {
	m := &leaseMetrics{
		granted: counter("etcd_debugging_lease_granted_total", "The total number of granted leases."),
		revoked: counter("etcd_debugging_lease_revoked_total", "The total number of revoked leases."),
		renewed: counter("etcd_debugging_lease_renewed_total", "The number of renewed leases seen by the leader."),
		ttls: histogram("etcd_debugging_lease_ttl_total", "Bucketed histogram of lease TTLs.",
			prometheus.ExponentialBuckets(1, 2, 24)),
		expired: counter("etcd_debugging_server_lease_expired_total", "The total number of expired leases."),
	}
	if reg != nil {
		reg.MustRegister(m.granted, m.revoked, m.renewed, m.ttls, m.expired)
	}
	return m
}

// answered counts a successful grant (with the TTL granted) or
// revocation from its answer (Request.End); the renewals are counted on
// the keepalive stream (KeepAliveSent).
func (m *leaseMetrics) answered(resp any) {
	switch r := resp.(type) {
	case *pb.LeaseGrantResponse:
		m.granted.Inc()
		m.ttls.Observe(float64(r.TTL))
	case *pb.LeaseRevokeResponse:
		m.revoked.Inc()
	}
}

// LeaseExpired counts a lease the leader revoked because its TTL ran out:
// an expiry, and a revocation as etcd's lessor counts it.
func (m *Metrics) LeaseExpired() {
	m.lease.expired.Inc()
	m.lease.revoked.Inc()
}

// KeepAliveSent counts a message a LeaseKeepAlive stream sent: a renewal
// when it is an answer with a TTL (an unknown lease is answered with TTL 0
// and renews nothing).
func (m *Metrics) KeepAliveSent(msg any) {
	if ka, ok := msg.(*pb.LeaseKeepAliveResponse); ok && ka.TTL > 0 {
		m.lease.renewed.Inc()
	}
}
